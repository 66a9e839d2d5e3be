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


def record_evaluation(peer: PeerState, loss_score: float, delta_assigned: float, median: float | None,
                      hp: HParams) -> None:
    """What one primary evaluation adds to a peer's record: LossScore and δ_assigned, the proof-of-computation EMA
    (an update that did not lower the random-data loss counts −1, ``poc_no_work``), the help record against the
    window's ``median`` LossScore (the last ``hp.help_memory`` ratios), and the evaluation count.  Shared by the
    window engine and the replays."""
    peer.loss_score, peer.delta_assigned = loss_score, delta_assigned
    peer.mu = (formulas.poc_update(peer.mu, delta_assigned, loss_score, hp.poc_gamma)
               if formulas.last_update_helped(loss_score) else formulas.poc_no_work(peer.mu, hp.poc_gamma))
    peer.help_ratios = [*peer.help_ratios, formulas.help_ratio(loss_score, median)][-hp.help_memory:]
    peer.eval_count += 1


def pay(peers: Mapping[int, PeerState], hp: HParams, previous: Mapping[int, float], unpaid: Iterable[int] = ()) -> Pay:
    """``(loss_ratings, scores, weights, unhelpful)`` for the peers in ``peers``.

    LossRating = μ_r − z·σ; PeerScore = LossRating while the proof of computation passes (evaluated, μ ≥
    ``hp.poc_floor``), else ``min(μ, LossRating, 0)``; a peer in ``unpaid`` (banned, failed a check this window),
    one whose record of copying bars it (``formulas.copy_record_bars_pay``) or one cut by its help record
    (``formulas.helped_recently``) scores at most 0; weights = power-normalised
    scores smoothed with ``previous`` (a peer with no weight this window is posted 0 at once).  ``unhelpful``:
    the peers cut by the help gate and those whose last evaluated update did not lower the loss — they stay
    out of the next top-G list while others can fill it."""
    ratings = {uid: ordinal(p.rating, hp.rating_z) for uid, p in peers.items()}
    scores = {uid: formulas.peer_score(p.mu, ratings[uid], formulas.poc_passes(p.mu, p.eval_count, hp.poc_floor))
              for uid, p in peers.items()}
    unhelped = {uid for uid, p in peers.items()
                if not formulas.helped_recently(p.help_ratios, hp.help_share, hp.help_rule)}
    barred = {uid for uid, p in peers.items() if formulas.copy_record_bars_pay(p.copies, p.passes)}
    for uid in unhelped | barred | (set(unpaid) & set(peers)):
        scores[uid] = min(scores[uid], 0.0)
    weights = formulas.smooth_weights(previous, formulas.normalise_weights(scores, hp.weight_power),
                                      hp.weight_smoothing)
    unhelpful = unhelped | {uid for uid, p in peers.items() if not formulas.last_update_helped(p.loss_score)}
    return ratings, scores, weights, unhelpful
