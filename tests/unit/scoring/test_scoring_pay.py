"""The pay rule (scoring/pay.py) on scripted evaluation outcomes: equal work earns equal pay, twice the work about
twice the pay and no more when split over two uids, and peers that do no work — always, or in some windows — earn
nothing (docs/scoring.md, "Pay").

Every peer is evaluated every window, as if |S_t| were the whole network. Its LossScore is b·(q + 0.33·N) with a
common scale b per window (q = 1 for an honest peer, 1.2 for the diligent one, which trains on twice the sequences;
0.33: the spread measured with 16 random sequences, 0.46, over √2 for the 32 of eval_sequences); its proof-of-
computation statistic is N(z, 1) with z = 3.7 for an honest update and 2.6 for the diligent one (whose trace per
sequence is fainter) and z = 0 for one that took no work on its data — the default model's figures
(docs/scoring.md). Everything after the draw — the record of each evaluation, the OpenSkill match, the pay rule — is
the validator's code."""
from __future__ import annotations

import itertools
import statistics

import numpy as np
import pytest

from dso.config.schema import HParams
from dso.protocol.rejections import Reason, Rejection
from scoring import formulas
from scoring.pay import Evaluation, pay, record_evaluation
from scoring.rating import rate_match
from scoring.state import PeerState
from scoring.window import _penalise

HONEST, DILIGENT, PART_TIMER = [1, 2, 3, 4], 5, 6
SPREAD = 0.33
SEQUENCES = {"honest": 144, "diligent": 288}
QUALITY = {"honest": 1.0, "diligent": 1.2}
POC_Z = {"honest": 3.7, "diligent": 2.6, "none": 0.0}


def kind(uid: int) -> str:
    return "diligent" if uid == DILIGENT else "honest"


def run(hp: HParams, seed: int, windows: int = 20, turns_bad: int | None = None,
        part_time: int | None = None) -> list[dict[int, float]]:
    """Posted weights per window.  ``turns_bad``: from that window on, peer 1 uploads noise (LossScore ≈ 0, no
    trace of its data).  ``part_time``: peer 6 joins, training one window in that many and replaying its last update
    otherwise — which the validator's history recognises (scoring/history.py): a replay rejection."""
    rng = np.random.default_rng(seed)
    uids = [*HONEST, DILIGENT] + ([PART_TIMER] if part_time else [])
    peers = {uid: PeerState() for uid in uids}
    posted: dict[int, float] = {}
    history = []
    for t in range(windows):
        b = 0.05 * 0.85 ** t
        works = {uid: not (uid == PART_TIMER and t % part_time) and not (turns_bad is not None and uid == 1
                                                                         and t >= turns_bad) for uid in uids}
        losses = {uid: b * (QUALITY[kind(uid)] + SPREAD * rng.standard_normal()) if works[uid]
                  else 0.05 * b * rng.standard_normal() for uid in uids}
        replays = {uid for uid in uids if uid == PART_TIMER and not works[uid] and t}
        for uid in replays:
            _penalise(peers[uid], Rejection(Reason.REPLAY, "its last update again"), hp, t)
            del losses[uid]
        median = formulas.help_median(losses.values())
        for uid in losses:
            z = POC_Z[kind(uid) if works[uid] else "none"] + rng.standard_normal()
            record_evaluation(peers[uid], Evaluation(losses[uid], 0.0, z, SEQUENCES[kind(uid)]), median, hp)
        for uid, (mu, sigma) in rate_match({u: peers[u].rating for u in losses}, losses, hp.rating_beta,
                                           hp.rating_tau).items():
            peers[uid].rating_mu, peers[uid].rating_sigma = mu, sigma
        posted = pay(peers, hp, posted, t, replays).weights
        history.append(posted)
    return history


def figures(hp: HParams, windows: int = 20) -> tuple[float, float]:
    """Medians over 10 seeds of the largest over the smallest honest share and of the diligent share over the
    honest mean, in the last window — the benchmark's figures (scripts/benchmarks/incentives.py)."""
    ratios, diligent = [], []
    for seed in range(10):
        last = run(hp, seed, windows)[-1]
        honest = [last[u] for u in HONEST]
        ratios.append(max(honest) / max(min(honest), 1e-6))
        diligent.append(last[DILIGENT] / max(statistics.mean(honest), 1e-6))
    return statistics.median(ratios), statistics.median(diligent)


@pytest.mark.parametrize("windows", [12, 30])
def test_equal_work_earns_alike_and_twice_the_work_about_twice_as_much(windows):
    ratio, diligent = figures(HParams(), windows)
    assert ratio <= 1.5, ratio
    assert 1.5 <= diligent <= 2.5, diligent


def test_splitting_the_work_over_two_uids_earns_no_more():
    """The diligent peer's compute split over two honest uids: two honest shares against its one (the median over
    10 seeds, as the benchmark reads it)."""
    ratios = []
    for seed in range(10):
        last = run(HParams(), seed)[-1]
        ratios.append(2 * statistics.mean(last[u] for u in HONEST) / max(last[DILIGENT], 1e-6))
    assert statistics.median(ratios) <= 1.0, ratios


@pytest.mark.parametrize("every", [2, 3, 5])
def test_a_part_time_miner_is_paid_nothing(every):
    """It trains one window in ``every`` and replays otherwise: every replay starts the cooldown, which lasts longer
    than its stretches of work; over 20 windows and 10 seeds it holds under 1 % of everything posted."""
    held = []
    for seed in range(10):
        rows = run(HParams(), seed, part_time=every)
        held.append(sum(row[PART_TIMER] for row in rows) / sum(sum(row.values()) for row in rows))
    assert max(held) < 0.01, held


def test_a_peer_that_turns_bad_is_paid_nothing_from_its_second_bad_evaluation():
    for seed in range(10):
        weights = run(HParams(), seed=seed, windows=16, turns_bad=10)
        assert weights[9][1] > 0.05, seed                       # paid like the other honest peers until then
        assert all(w[1] == 0.0 for w in weights[11:]), seed     # the help gate and the record's mean


def test_a_peer_is_paid_once_two_tests_prove_its_work_and_not_within_the_cooldown_of_a_replay():
    hp, peer = HParams(), PeerState(passes=10)
    record_evaluation(peer, Evaluation(0.01, 0.0, 3.0, 144), 0.01, hp)
    assert pay({1: peer}, hp, {}, 0).weights == {1: 0.0}
    record_evaluation(peer, Evaluation(0.01, 0.0, 0.5, 144), 0.01, hp)        # a mean of 1.75, the last too low
    assert pay({1: peer}, hp, {}, 1).weights == {1: 0.0}
    record_evaluation(peer, Evaluation(0.01, 0.0, 1.0, 144), 0.01, hp)        # 4.5 / 3 = 1.5, the last ≥ 0.75
    assert pay({1: peer}, hp, {}, 2).weights == {1: 1.0}
    record_evaluation(peer, Evaluation(0.01, 0.0, -1.0, 144), 0.01, hp)       # 3.5 / 4 = 0.875: not paid
    assert pay({1: peer}, hp, {}, 3).weights == {1: 0.0}
    for _ in range(2):
        record_evaluation(peer, Evaluation(0.01, 0.0, 4.0, 144), 0.01, hp)    # the record keeps the last four: 2.0
    assert pay({1: peer}, hp, {}, 3).weights == {1: 1.0}
    _penalise(peer, Rejection(Reason.REPLAY, "window 1's update again"), hp, 4)
    assert peer.poc_failed_window == 4
    assert pay({1: peer}, hp, {}, 14).weights == {1: 0.0}
    assert pay({1: peer}, hp, {}, 15).weights == {1: 1.0}


def test_a_peer_not_evaluated_yet_is_not_paid_and_the_cold_start_still_pays_nobody():
    peers = {uid: PeerState() for uid in [*HONEST, DILIGENT]}
    result = pay(peers, HParams(), {}, 0)
    assert result.scores == {uid: 0.0 for uid in peers} and sum(result.weights.values()) == 0.0


def test_smoothing_steadies_the_posted_weights():
    def jitter(hp: HParams) -> float:  # mean L1 change of the posted row over the last 10 windows, 10 seeds
        rows = [run(hp, seed)[-11:] for seed in range(10)]
        return statistics.mean(sum(abs(a[u] - b[u]) for u in a) for r in rows for a, b in itertools.pairwise(r))
    assert jitter(HParams()) < 0.8 * jitter(HParams(weight_smoothing=1.0))


def proven(**fields) -> PeerState:
    """A peer with two passed tests of 144 sequences and full help."""  # noqa: D401
    return PeerState(**{"mu": 0.3, "loss_score": 0.01, "eval_count": 5, "work": [144, 144],
                        "poc_record": [3.5, 3.5], "help_ratios": [1.0, 1.0], "passes": 10, **fields})


@pytest.mark.parametrize("unpaid", [{2}, {2, 5}])
def test_unpaid_peers_get_nothing_and_the_rest_sums_to_one(unpaid):
    peers = {uid: proven() for uid in [*HONEST, DILIGENT]}
    result = pay(peers, HParams(), {}, 20, unpaid)
    assert all(result.weights[u] == 0.0 and result.scores[u] <= 0 for u in unpaid)
    assert sum(result.weights.values()) == pytest.approx(1.0)
    assert len({round(result.weights[u], 12) for u in result.weights if u not in unpaid}) == 1


def test_pay_follows_the_verified_work_and_quality():
    peers = {1: proven(), 2: proven(work=[288, 288]), 3: proven(help_ratios=[0.5, 0.5]),
             4: proven(poc_record=[3.0, -0.1])}
    result = pay(peers, HParams(), {}, 20)
    assert result.scores[4] <= 0 and result.scores == pytest.approx({1: 144.0, 2: 288.0, 3: 72.0, 4: 0.0})
    assert result.weights == pytest.approx({1: 144 / 504, 2: 288 / 504, 3: 72 / 504, 4: 0.0})


def test_a_record_of_copying_bars_pay_and_an_author_that_keeps_its_update_is_paid():
    """Copy detection can miss, or keep a copy over its author by a noisy tie-break: a peer rejected as a copy in
    at least as many windows as it passed is paid nothing; the author it copies, rejected in a few windows only,
    keeps its pay (scoring/formulas.py ``copy_record_bars_pay``)."""
    peers = {uid: proven() for uid in [*HONEST, DILIGENT]}
    copier, author = peers[DILIGENT], peers[1]
    copier.copies, copier.passes = 2, 2                               # slipped through as often as it was caught
    author.copies = 4                                                 # lost 4 tie-breaks, kept its update in 10
    result = pay(peers, HParams(), {DILIGENT: 0.5}, 20)
    assert result.weights[DILIGENT] == 0.0 and result.scores[DILIGENT] <= 0 and DILIGENT not in result.unhelpful
    assert result.weights[1] == pytest.approx(result.weights[2]) and result.weights[1] > 0
    copier.passes = 3                                                 # one more clean window than copies: paid
    assert pay(peers, HParams(), {}, 20).weights[DILIGENT] == pytest.approx(1 / 5)   # equal work, equal pay


@pytest.mark.parametrize("copies, passes, barred", [(0, 0, False), (0, 5, False), (1, 0, True), (1, 1, True),
                                                    (3, 2, True), (2, 3, False), (12, 2, True)])
def test_copy_record_bars_pay_from_half_of_its_windows(copies, passes, barred):
    assert formulas.copy_record_bars_pay(copies, passes) is barred


def test_paper_peer_score_is_mu_times_rating_and_never_rewards_two_negatives():
    assert formulas.paper_peer_score(0.5, 2.0) == 1.0
    assert formulas.paper_peer_score(-0.5, -2.0) == -2.0   # not +1.0
    assert formulas.paper_peer_score(0.5, -2.0) == -2.0
    assert formulas.paper_peer_score(float("nan"), 1.0) == formulas.MU_MIN


def test_the_peerscore_rule_pays_mu_times_rating_with_power_two():
    """The gauntlet profile's rule: weights ∝ (μ·LossRating)², behind the same cuts (a peer cut by the help gate
    gets nothing); literal expected values."""
    hp = HParams()
    hp.pay_rule, hp.weight_power, hp.weight_smoothing = "peerscore", 2.0, 1.0
    peers = {uid: PeerState() for uid in (1, 2, 3)}
    for uid, mu in ((1, 0.5), (2, 0.5), (3, 0.9)):
        peers[uid].mu, peers[uid].help_ratios = mu, [1.0, 1.0]
    peers[3].help_ratios = [0.0, 0.0]  # cut: its updates did not help
    got = pay(peers, hp, {}, window=5)
    r1, r2 = got.ratings[1], got.ratings[2]
    assert r1 == pytest.approx(r2) and r1 > 0  # equal fresh ratings
    assert got.scores[1] == pytest.approx(0.5 * r1) and got.scores[3] <= 0
    assert got.weights == pytest.approx({1: 0.5, 2: 0.5, 3: 0.0})
    peers[2].mu = 0.25  # half the μ: a quarter of the weight before normalising (c = 2)
    got = pay(peers, hp, {}, window=6)
    assert got.weights[1] == pytest.approx(0.8) and got.weights[2] == pytest.approx(0.2)
