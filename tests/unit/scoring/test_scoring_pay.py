"""The pay rule (scoring/pay.py) on scripted evaluation outcomes: equal work earns equal pay, more work more,
and a peer that turns bad loses its weight within two evaluations, rarely four (issue 17, docs/scoring.md "Fair,
stable weights").

The outcomes are drawn like those of the recorded default-model simulator run on current training (seed 1, windows
5–19; scripts/benchmarks/pay_replay.py prints these figures from a trace): honest LossScores 0.46 × their mean
apart (standard deviation), the diligent peer's 1.2 × the honest mean (median), δ_assigned > δ_rand in 52 % of
honest and 70 % of diligent evaluations (the proof-of-computation sign test is weak).  Per window a common scale b;
an honest peer's LossScore b·(1 + 0.46·N), the diligent peer's b·(1.2 + 0.46·N); δ_assigned − δ_rand = b·(0.05 + N)
for an honest peer, b·(0.52 + N) for the diligent one.  Everything after the draw — the OpenSkill match, the
evaluation record (PoC EMA, help record), the pay rule — is the validator's code."""
from __future__ import annotations

import statistics

import numpy as np
import pytest

from dso.config import HParams
from scoring import formulas
from scoring.pay import pay, record_evaluation
from scoring.rating import ordinal, rate_match
from scoring.state import PeerState

HONEST, DILIGENT = [1, 2, 3, 4], 5
SPREAD, DILIGENT_MEAN, POC_BIAS = 0.46, 1.2, {"honest": 0.05, "diligent": 0.52}


def multiplier_rule(peers: dict[int, PeerState], hp: HParams, previous: dict[int, float], median: float):
    """The rule before this one (branch f17b): PeerScore = min(μ, 0.2)·LossRating (sign-safe), paid only while the
    last LossScore is ≥ 0.25 × the window's median."""
    scores = {}
    for uid, p in peers.items():
        mu, rating = min(p.mu, 0.2), ordinal(p.rating, hp.rating_z)
        score = mu * rating if mu > 0 and rating > 0 else min(mu, rating)
        helped = p.loss_score is not None and p.loss_score > 0 and p.loss_score >= 0.25 * median
        scores[uid] = score if helped else min(score, 0.0)
    return formulas.smooth_weights(previous, formulas.normalise_weights(scores, hp.weight_power), hp.weight_smoothing)


def run(hp: HParams, seed: int, windows: int = 20, turns_bad: int | None = None,
        old_rule: bool = False) -> list[dict[int, float]]:
    """Posted weights per window; ``turns_bad``: from that window on, peer 1 uploads noise (LossScore about 0)."""
    rng = np.random.default_rng(seed)
    peers = {uid: PeerState() for uid in [*HONEST, DILIGENT]}
    posted: dict[int, float] = {}
    history = []
    for t in range(windows):
        b = 0.05 * 0.85 ** t
        losses = {uid: b * ((DILIGENT_MEAN if uid == DILIGENT else 1.0) + SPREAD * rng.standard_normal())
                  for uid in peers}
        assigned = {uid: losses[uid] + b * (POC_BIAS["diligent" if uid == DILIGENT else "honest"]
                                            + rng.standard_normal()) for uid in peers}
        if turns_bad is not None and t >= turns_bad:
            losses[1] = 0.05 * b * rng.standard_normal()           # noise: ± a twentieth of an honest step
            assigned[1] = losses[1] + 0.05 * b * rng.standard_normal()
        median = formulas.help_median(losses.values())
        for uid, peer in peers.items():
            record_evaluation(peer, losses[uid], assigned[uid], median, hp)
        for uid, (mu, sigma) in rate_match({u: p.rating for u, p in peers.items()}, losses, hp.rating_beta,
                                           hp.rating_tau).items():
            peers[uid].rating_mu, peers[uid].rating_sigma = mu, sigma
        posted = multiplier_rule(peers, hp, posted, median) if old_rule else pay(peers, hp, posted)[2]
        history.append(posted)
    return history


def figures(hp: HParams, old_rule: bool = False) -> tuple[float, int]:
    """Median (over 10 seeds) of the largest over the smallest honest share, and the seeds where the diligent
    peer gets ≥ 1.5 × the honest mean — the benchmark's figures (scripts/benchmarks/incentives.py)."""
    ratios, wins = [], 0
    for seed in range(10):
        last = run(hp, seed, old_rule=old_rule)[-1]
        honest = [last[u] for u in HONEST]
        ratios.append(max(honest) / max(min(honest), 1e-6))
        wins += last[DILIGENT] >= 1.5 * statistics.mean(honest)
    return statistics.median(ratios), wins


def test_defaults_pay_equal_work_alike():
    ratio, _ = figures(HParams())
    assert ratio <= 2.0, ratio                 # measured 1.45


@pytest.mark.xfail(strict=True, reason="missed on current training: the diligent peer's LossScore is only ~1.2 × the "
                   "honest mean with a spread of 0.46, so its rating stands clear of the honest ones in 3 of 10 seeds "
                   "(5 with weight_power 1); docs/scoring.md 'Fair, stable weights'")
def test_defaults_pay_the_diligent_peer_more_in_nine_of_ten_seeds():
    _, wins = figures(HParams())
    assert wins >= 9, wins


def test_the_multiplier_rule_before_fails_equal_pay_on_a_weak_proof_of_computation():
    ratio, _ = figures(HParams(), old_rule=True)
    assert ratio > 1e3, ratio  # an honest peer with μ ≤ 0 is paid nothing: the test above can fail


def test_a_peer_that_turns_bad_is_paid_nothing_from_its_second_bad_evaluation_with_one_exception():
    runs = [run(HParams(), seed=seed, windows=16, turns_bad=10) for seed in range(10)]
    paid = [w for w in runs if w[9][1] >= 0.05]                  # paid like the other honest peers until then
    assert len(paid) >= 7
    # evaluated every window: nothing from its second bad evaluation, except where its noise happened to score
    # above a fifth of a low window median once (seed 9: 0.22 in window 11), which holds it two windows more
    from_second = [all(w[1] == 0.0 for w in weights[11:]) for weights in paid]
    assert sum(from_second) >= len(paid) - 1, from_second
    assert all(w[1] == 0.0 for weights in paid for w in weights[13:])


def test_a_no_work_peer_fails_the_proof_of_computation_within_six_evaluations():
    """Zeros in every evaluated window: LossScore 0, so each evaluation counts −1 in the PoC EMA and μ crosses the
    floor (−0.25) at the sixth; the help gate has cut it from the first."""
    peer, hp = PeerState(), HParams()
    passing = []
    for _ in range(8):
        record_evaluation(peer, 0.0, 0.0, 0.004, hp)
        passing.append(formulas.poc_passes(peer.mu, peer.eval_count, hp.poc_floor))
        assert not formulas.helped_recently(peer.help_ratios, hp.help_share, hp.help_rule)
    assert passing == [True] * 5 + [False] * 3


def test_a_peer_not_evaluated_yet_is_not_paid_and_the_cold_start_still_pays_nobody():
    peers = {uid: PeerState() for uid in [*HONEST, DILIGENT]}
    _, scores, weights, _ = pay(peers, HParams(), {})
    assert scores == {uid: 0.0 for uid in peers} and sum(weights.values()) == 0.0


def test_smoothing_steadies_the_posted_weights():
    def jitter(hp: HParams) -> float:  # mean L1 change of the posted row over the last 10 windows, 10 seeds
        rows = [run(hp, seed)[-11:] for seed in range(10)]
        return statistics.mean(sum(abs(a[u] - b[u]) for u in a) for r in rows for a, b in zip(r, r[1:]))
    # measured 0.074 against 0.099: smoothing slows rises; a cut still drops a peer to 0 at once
    assert jitter(HParams()) < 0.8 * jitter(HParams(weight_smoothing=1.0))


@pytest.mark.parametrize("unpaid", [{2}, {2, 5}])
def test_unpaid_peers_get_nothing_and_the_rest_sums_to_one(unpaid):
    peers = {uid: PeerState(mu=0.3, loss_score=0.01, eval_count=5) for uid in [*HONEST, DILIGENT]}
    _, scores, weights, _ = pay(peers, HParams(), {}, unpaid)
    assert all(weights[u] == 0.0 and scores[u] <= 0 for u in unpaid)
    assert sum(weights.values()) == pytest.approx(1.0)
    assert len({round(weights[u], 12) for u in weights if u not in unpaid}) == 1   # equal standing, equal pay


def test_a_record_of_copying_bars_pay_and_an_author_that_keeps_its_update_is_paid():
    """Copy detection can miss, or keep a copy over its author by a noisy tie-break: a peer rejected as a copy in
    at least as many windows as it passed is paid nothing even with the best standing; the author it copies,
    rejected in a few windows only, keeps its pay (scoring/formulas.py ``copy_record_bars_pay``)."""
    peers = {uid: PeerState(mu=0.3, loss_score=0.01, passes=10, eval_count=10) for uid in [*HONEST, DILIGENT]}
    copier, author = peers[DILIGENT], peers[1]
    copier.rating_mu, copier.copies, copier.passes = 40.0, 2, 2     # slipped through as often as it was caught
    author.copies = 4                                                 # lost 4 tie-breaks, kept its update in 10
    _, scores, weights, unhelpful = pay(peers, HParams(), {DILIGENT: 0.5})
    assert weights[DILIGENT] == 0.0 and scores[DILIGENT] <= 0 and DILIGENT not in unhelpful
    assert weights[1] == pytest.approx(weights[2]) and weights[1] > 0
    copier.passes = 3                                                 # one more clean window than copies: paid
    assert pay(peers, HParams(), {})[2][DILIGENT] > weights[2]


@pytest.mark.parametrize("copies, passes, barred", [(0, 0, False), (0, 5, False), (1, 0, True), (1, 1, True),
                                                    (3, 2, True), (2, 3, False), (12, 2, True)])
def test_copy_record_bars_pay_from_half_of_its_windows(copies, passes, barred):
    assert formulas.copy_record_bars_pay(copies, passes) is barred
