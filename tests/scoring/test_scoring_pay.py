"""The pay rule (scoring/pay.py) on scripted evaluation outcomes: equal work earns equal pay, more work more,
and a peer that turns bad loses its weight at once (issue 17, docs/scoring.md "Fair, stable weights").

The outcomes are drawn like those of four recorded default-model simulator runs (windows 5–19: honest
LossScores 0.185 × their mean apart (standard deviation), the diligent peer's 1.47 × the honest mean (median),
δ_assigned > δ_rand in 75 % of honest and 88 % of diligent evaluations): per window a common scale b; an honest
peer's LossScore b·(1 + 0.2·N), the diligent peer's b·(1.5 + 0.2·N); δ_assigned − δ_rand = b·(0.4 + 0.6·N) for
an honest peer, b·(0.7 + 0.6·N) for the diligent one.  Everything after the draw — the OpenSkill match, the
proof-of-computation EMA, the pay rule — is the validator's code."""
from __future__ import annotations

import statistics

import numpy as np
import pytest

from dso.config import HParams
from scoring import formulas
from scoring.pay import pay
from scoring.rating import rate_match
from scoring.state import PeerState

HONEST, DILIGENT = [1, 2, 3, 4], 5
OLD = {"rating_z": 3.0, "poc_cap": 1.0, "weight_power": 2.0, "weight_smoothing": 1.0}  # before issue 17


def run(hp: HParams, seed: int, windows: int = 20, turns_bad: int | None = None) -> list[dict[int, float]]:
    """Posted weights per window; ``turns_bad``: from that window on, peer 1 uploads noise (LossScore < 0)."""
    rng = np.random.default_rng(seed)
    peers = {uid: PeerState() for uid in [*HONEST, DILIGENT]}
    posted: dict[int, float] = {}
    history = []
    for t in range(windows):
        b = 0.05 * 0.9 ** t
        losses = {uid: b * ((1.5 if uid == DILIGENT else 1.0) + 0.2 * rng.standard_normal()) for uid in peers}
        assigned = {uid: losses[uid] + b * ((0.7 if uid == DILIGENT else 0.4) + 0.6 * rng.standard_normal())
                    for uid in peers}
        if turns_bad is not None and t >= turns_bad:
            losses[1], assigned[1] = -10 * b, -10 * b + b * rng.standard_normal()
        for uid, peer in peers.items():
            peer.loss_score = losses[uid]
            peer.mu = formulas.poc_update(peer.mu, assigned[uid], losses[uid], hp.poc_gamma)
        for uid, (mu, sigma) in rate_match({u: p.rating for u, p in peers.items()}, losses, hp.rating_beta,
                                           hp.rating_tau).items():
            peers[uid].rating_mu, peers[uid].rating_sigma = mu, sigma
        _, _, posted, _ = pay(peers, hp, posted)
        history.append(posted)
    return history


def figures(hp: HParams) -> tuple[float, int]:
    """Median (over 10 seeds) of the largest over the smallest honest share, and the seeds where the diligent
    peer gets ≥ 1.5 × the honest mean — the benchmark's figures (scripts/benchmarks/incentives.py)."""
    ratios, wins = [], 0
    for seed in range(10):
        last = run(hp, seed)[-1]
        honest = [last[u] for u in HONEST]
        ratios.append(max(honest) / max(min(honest), 1e-6))
        wins += last[DILIGENT] >= 1.5 * statistics.mean(honest)
    return statistics.median(ratios), wins


def test_defaults_pay_equal_work_alike_and_more_work_more():
    ratio, wins = figures(HParams())
    assert ratio <= 2.0 and wins >= 9, (ratio, wins)


def test_the_rule_before_issue_17_fails_the_same_targets():
    ratio, wins = figures(HParams(**OLD))
    assert ratio > 2.0, ratio  # equal peers far apart: the test above can fail


def test_a_peer_that_turns_bad_is_paid_nothing_from_its_next_evaluation():
    weights = run(HParams(), seed=3, windows=16, turns_bad=10)
    assert weights[9][1] >= 0.05                     # paid like the other honest peers until then
    assert all(w[1] == 0.0 for w in weights[10:])    # evaluated every window here: nothing from the first bad one


def test_smoothing_steadies_the_posted_weights():
    def jitter(hp: HParams) -> float:  # mean L1 change of the posted row over the last 10 windows, 10 seeds
        rows = [run(hp, seed)[-11:] for seed in range(10)]
        return statistics.mean(sum(abs(a[u] - b[u]) for u in a) for r in rows for a, b in zip(r, r[1:]))
    assert jitter(HParams()) < 0.75 * jitter(HParams(weight_smoothing=1.0))


@pytest.mark.parametrize("unpaid", [{2}, {2, 5}])
def test_unpaid_peers_get_nothing_and_the_rest_sums_to_one(unpaid):
    peers = {uid: PeerState(mu=0.3, loss_score=0.01) for uid in [*HONEST, DILIGENT]}
    _, scores, weights, _ = pay(peers, HParams(), {}, unpaid)
    assert all(weights[u] == 0.0 and scores[u] <= 0 for u in unpaid)
    assert sum(weights.values()) == pytest.approx(1.0)
    assert len({round(weights[u], 12) for u in weights if u not in unpaid}) == 1   # equal standing, equal pay


def test_a_record_of_copying_bars_pay_and_an_author_that_keeps_its_update_is_paid():
    """Copy detection can miss, or keep a copy over its author by a noisy tie-break: a peer rejected as a copy in
    at least as many windows as it passed is paid nothing even with the best standing; the author it copies,
    rejected in a few windows only, keeps its pay (scoring/formulas.py ``copy_record_bars_pay``)."""
    peers = {uid: PeerState(mu=0.3, loss_score=0.01, passes=10) for uid in [*HONEST, DILIGENT]}
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
