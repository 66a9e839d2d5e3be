"""From each peer's standing to the weights a validator posts (design §6.3, docs/scoring.md "Pay").

A pure function of the peers' stored state, the run's hyper-parameters, the window and the last posted weights,
so the window engine (scoring/window.py) and the incentive tests share one rule.

Two numbers per peer come out of it:

* its **standing**: the LossRating while its proof of computation holds (``formulas.peer_score``), which orders
  the next top-G list, so the network aggregates the updates that help most;
* its **pay score**: the work it proved (the sequences it declares it trained on, which the proof of computation
  tests) times the quality of its updates (``formulas.pay_score``), for a peer that passes every gate, else at
  most 0.  The weights are the pay scores, normalised and smoothed.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from dso.config.schema import HParams
from scoring import formulas
from scoring.help_gate import help_gate
from scoring.rating import ordinal
from scoring.state import PeerState


@dataclass(frozen=True)
class Evaluation:
    """What one primary evaluation measured of a peer's update."""

    loss_score: float       # δ_rand: the mean loss gain on random sequences
    delta_assigned: float   # the mean loss gain on the sequences it declared it trained on
    poc_statistic: float    # formulas.poc_statistic of the two sets of per-sequence gains
    trained: int            # the sequences it declared it trained on


@dataclass(frozen=True)
class Pay:
    ratings: dict[int, float]    # LossRating (μ − z·σ)
    standing: dict[int, float]   # orders the next top-G list
    scores: dict[int, float]     # pay scores (≤ 0: not paid)
    weights: dict[int, float]    # posted: normalised pay scores, smoothed with the last posted
    unhelpful: set[int]          # cut by the help gate, or its last update did not lower the loss


def record_evaluation(peer: PeerState, evaluation: Evaluation, median: float | None, hp: HParams) -> None:
    """What one primary evaluation adds to a peer's record: LossScore, the proof of computation (its statistic, the
    sequences declared, the verdict into μ), the help ratio against the window's ``median`` LossScore, and the
    evaluation count.  Shared by the window engine and the replays."""
    passed = formulas.poc_verdict(evaluation.poc_statistic, hp.poc_threshold)
    peer.loss_score, peer.delta_assigned = evaluation.loss_score, evaluation.delta_assigned
    peer.mu = formulas.poc_update(peer.mu, passed, hp.poc_gamma)
    peer.poc_record = [*peer.poc_record, formulas.bound_statistic(evaluation.poc_statistic)][-hp.poc_memory:]
    peer.work = [*peer.work, evaluation.trained][-hp.poc_memory:]
    peer.help_ratios = [*peer.help_ratios, formulas.help_ratio(evaluation.loss_score, median)][-hp.help_memory:]
    peer.eval_count += 1


def work_scores(peers: Mapping[int, PeerState], ratings: Mapping[int, float], proofs: Mapping[int, bool],
                standing: Mapping[int, float], cut: set[int], hp: HParams) -> dict[int, float]:
    """This project's rule: the proven work times its quality, for a peer that passes every gate."""
    gate = help_gate(hp)
    return {uid: (formulas.pay_score(p.work, gate.quality(p.help_ratios))
                  if proofs[uid] and uid not in cut else min(standing[uid], 0.0))
            for uid, p in peers.items()}


def peerscore_scores(peers: Mapping[int, PeerState], ratings: Mapping[int, float], proofs: Mapping[int, bool],
                     standing: Mapping[int, float], cut: set[int], hp: HParams) -> dict[int, float]:
    """The Gauntlet paper's rule (its eq. 4 before the power): PeerScore = PoC μ × LossRating, at most 0 when cut."""
    return {uid: (formulas.paper_peer_score(p.mu, ratings[uid]) if uid not in cut else min(standing[uid], 0.0))
            for uid, p in peers.items()}


PayRuleFn = Callable[[Mapping[int, PeerState], Mapping[int, float], Mapping[int, bool], Mapping[int, float], set[int],
                      HParams], dict[int, float]]
PAY_RULES: dict[str, PayRuleFn] = {"work": work_scores, "peerscore": peerscore_scores}  # hparams.pay_rule


def pay(peers: Mapping[int, PeerState], hp: HParams, previous: Mapping[int, float], window: int,
        unpaid: Iterable[int] = ()) -> Pay:
    """The peers' standing, pay scores and posted weights after ``window``.

    Paid: a peer whose proof of computation pays (``formulas.poc_pays``: proven work, no upload without work within
    the cooldown, μ at its floor or above), whose help record passes (the run's ``scoring.help_gate``), whose record
    of copying does not bar it (``formulas.copy_record_bars_pay``) and that is not in ``unpaid`` (banned, failed a
    check this window).  Everyone else scores at most 0 and gets no weight."""
    ratings = {uid: ordinal(p.rating, hp.rating_z) for uid, p in peers.items()}
    proofs = {uid: formulas.poc_pays(p.poc_record, p.poc_failed_window, window, p.mu, hp.poc_cooldown, hp.poc_floor,
                                     hp.poc_threshold)
              for uid, p in peers.items()}
    standing = {uid: formulas.peer_score(p.mu, ratings[uid], proofs[uid]) for uid, p in peers.items()}
    gate = help_gate(hp)
    unhelped = {uid for uid, p in peers.items() if not gate.helps(p.help_ratios)}
    barred = {uid for uid, p in peers.items() if formulas.copy_record_bars_pay(p.copies, p.passes)}
    cut = unhelped | barred | (set(unpaid) & set(peers))
    for uid in cut:
        standing[uid] = min(standing[uid], 0.0)
    scores = PAY_RULES[hp.pay_rule](peers, ratings, proofs, standing, cut, hp)
    weights = formulas.smooth_weights(previous, formulas.normalise_weights(scores, hp.weight_power),
                                      hp.weight_smoothing)
    unhelpful = unhelped | {uid for uid, p in peers.items() if not formulas.last_update_helped(p.loss_score)}
    return Pay(ratings, standing, scores, weights, unhelpful)
