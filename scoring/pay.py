"""From each peer's standing to the weights a validator posts (design §6.3, docs/scoring.md "Fair, stable weights").

A pure function of the peers' stored state, the run's hyper-parameters and the last posted weights, so the
window engine (scoring/window.py) and the incentive tests share one rule.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from dso.config import HParams
from scoring import formulas
from scoring.rating import ordinal
from scoring.state import PeerState


Pay = tuple[dict[int, float], dict[int, float], dict[int, float], set[int]]


def pay(peers: Mapping[int, PeerState], hp: HParams, previous: Mapping[int, float], unpaid: Iterable[int] = (),
        median_loss_score: float | None = None) -> Pay:
    """``(loss_ratings, scores, weights, unhelpful)`` for the peers in ``peers``.

    LossRating = μ_r − z·σ; PeerScore = LossRating while the proof of computation passes (evaluated, μ ≥
    ``hp.poc_floor``), else ``min(μ, LossRating, 0)``; a peer in ``unpaid`` (banned,
    failed a check this window), one whose record of copying bars it (``formulas.copy_record_bars_pay``) or one
    whose last evaluated update did not lower the random-data loss by at least ``hp.help_share`` of
    ``median_loss_score`` (the window's median LossScore; returned as ``unhelpful``) scores at most 0; weights =
    power-normalised scores smoothed with ``previous`` (a peer with no weight this window is posted 0 at once)."""
    ratings = {uid: ordinal(p.rating, hp.rating_z) for uid, p in peers.items()}
    scores = {uid: formulas.peer_score(p.mu, ratings[uid], formulas.poc_passes(p.mu, p.eval_count, hp.poc_floor))
              for uid, p in peers.items()}
    unhelpful = {uid for uid, p in peers.items()
                 if not formulas.last_update_helped(p.loss_score, median_loss_score, hp.help_share)}
    barred = {uid for uid, p in peers.items() if formulas.copy_record_bars_pay(p.copies, p.passes)}
    for uid in unhelpful | barred | (set(unpaid) & set(peers)):
        scores[uid] = min(scores[uid], 0.0)
    weights = formulas.smooth_weights(previous, formulas.normalise_weights(scores, hp.weight_power),
                                      hp.weight_smoothing)
    return ratings, scores, weights, unhelpful
