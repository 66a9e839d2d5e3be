"""One Gauntlet window on the validator: fast checks, primary evaluation, ratings, weights.

:func:`score_window` is the single entry point the validator process calls per
window, after gathering the window's payloads and *before* applying the
window's aggregate (``model`` must hold θ_t, the model the miners trained on).
It updates ``state`` all-or-nothing (the caller saves it afterwards) and
returns a :class:`WindowReport`.  Order, as in the paper's Algorithm 1:

1. F_t: current top-G + peers drawn from ``eval_seed`` (scoring/selection.py).  Each gets the fast
   checks — a rejection from the gatherer, no payload, a malformed sync vector,
   or SyncScore above ``sync_threshold`` — and at most one penalty on μ.
2. S_t ⊆ peers that passed, drawn the same way: the losses of ``eval_sequences`` random sequences once, then per
   peer the losses, sequence by sequence, of ``poc_sequences`` of the sequences it declared it trained on, at θ_t
   and at θ'_p, and of the random ones at θ'_p (in place); LossScore = δ_rand; the proof of computation tests the
   per-sequence gains (scoring/pay.py records the verdict); one OpenSkill match over S_t updates the ratings.
3. Standing (orders the next top-G list) and pay scores (verified work × quality) for the active peers →
   power-normalised weights, smoothed with the last posted ones (``hp.weight_smoothing``) → next top-G list.

With ``hp.commit_reveal`` on, penalties follow the ZIP-407 table mapped onto μ
(:func:`penalty_multiplier`, docs/extensions.md §2): a commit-reveal offence, a
copy or an invalid update costs more than the plain φ, every invalid update is
counted (``offences["invalid"]``), and the third one bans the uid — μ drops to
zero or below, and it gets no weight and no place in the top-G list until its
hotkey changes.

Model access: ``named_parameters`` (snapshot, in-place step, restore) and
``model.sequence_losses`` through :func:`dso.training.train.sequence_losses`.  Dataset access:
``assigned_rows``/``rows`` of the evaluated peers and one ``unassigned`` draw.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dso.codec.codecs import Codec
from dso.config.schema import HParams
from dso.nn.model import Decoder, parameter_shapes, sync_sample_count
from dso.protocol.commit import BAN_AFTER, commit_penalty, is_invalid_update
from dso.protocol.payload import Payload
from dso.protocol.rejections import Reason, Rejection
from dso.training.outer import peer_norms, reference_norms
from dso.training.outer_rules import outer_rule
from dso.training.train import learning_rate
from scoring import formulas, selection
from scoring.evaluation import ParameterSnapshot, PeerEvaluator, PeerLosses, SharedInputs, evaluate_peers, random_losses
from scoring.pay import Evaluation, pay, record_evaluation
from scoring.rating import rate_match
from scoring.schedules import DRAWN, PURPOSE_EVAL, PURPOSE_FAST, EvalSchedule
from scoring.state import PeerState, ValidatorState
from scoring.sync import check_sync_vector, sample_parameters, sync_positions

if TYPE_CHECKING:
    from dso.data.dataset import Dataset

# Purposes of the validator's private per-window randomness (never reuse a number).


@dataclass(frozen=True)
class Scorer:
    """What scores every window: the validator's model (θ_t on entry to a window), the run's codec, data and
    hyper-parameters, and who computes the evaluated peers' losses (default: this process, one peer after
    another; a torchrun validator's ranks share them, neurons/validator_ranks.py)."""

    model: Decoder
    codec: Codec
    dataset: Dataset
    hp: HParams
    evaluator: PeerEvaluator | None = None
    schedule: EvalSchedule = DRAWN        # how F_t, S_t and the evaluation data are drawn (scoring/schedules.py)


@dataclass(frozen=True)
class WindowEvidence:
    """What the transport and the chain gave the validator for one window."""

    window: int
    payloads: Mapping[int, Payload]         # passed the transport checks (and copy detection)
    rejections: Mapping[int, Rejection]     # why the others failed
    active: Mapping[int, str] | Iterable[int]  # registered uids (uid → hotkey also resets a uid whose hotkey changed)
    randomness: bytes                       # the window's chain randomness: sync positions
    eval_seed: bytes                        # chain randomness after the uploads closed: draws F_t and S_t
    reference_norms: Mapping[str, float] | None = None  # per tensor: sizes the optimiser rules' evaluation step
    sync_unit: float | None = None          # SyncScore's unit: the mean |θ_{t+1} − θ_t| of the window's outer step
    control: Mapping[str, torch.Tensor] | None = None  # the consensus step the proof of computation compares with:
    #                                        eval_scale × (θ_t − θ_{t+1}); None = none (the random side's base)


class WindowAlreadyScored(ValueError):
    """score_window was called for a window not after the last one scored (it would penalise twice)."""


@dataclass
class WindowReport:
    window: int
    fast: list[int]                       # F_t
    evaluated: list[int]                  # S_t peers whose update was evaluated
    rejections: dict[int, str]            # uid → why it failed a check this window (each penalised once)
    sync_scores: dict[int, float]
    loss_scores: dict[int, float]         # δ_rand (LossScore) of evaluated peers
    assigned_deltas: dict[int, float]     # δ_assigned of evaluated peers
    poc_statistics: dict[int, float]      # the proof of computation's statistic of evaluated peers
    base_rand_loss: float | None          # L(θ_t, D_rand), None when nobody was evaluated
    mu: dict[int, float]                  # every active peer, after this window
    loss_ratings: dict[int, float]
    scores: dict[int, float]              # pay scores (≤ 0: not paid)
    weights: dict[int, float]             # sums to 1, or all zeros
    top_g: list[int]                      # the list in effect from window + 1
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly (non-finite floats as strings)."""
        def clean(x: Any) -> Any:
            if isinstance(x, float) and not math.isfinite(x):
                return str(x)
            if isinstance(x, dict):
                return {str(k): clean(v) for k, v in x.items()}
            if isinstance(x, list):
                return [clean(v) for v in x]
            return x
        cleaned: dict[str, Any] = clean(asdict(self))
        return cleaned


def plan_fast_set(state: ValidatorState, hp: HParams, window: int, active: Iterable[int],
                  eval_seed: bytes, schedule: EvalSchedule = DRAWN) -> list[int]:
    """F_t, for a validator that wants to download only those payloads.  Same answer as inside
    :func:`score_window` as long as ``state`` has not changed in between."""
    active = sorted(set(active))
    return selection.fast_set(state.top_g, active, lambda uid: _peer_or_new(state, uid).last_fast_window,
                              hp.fast_peers, schedule.picker(state, hp, window, eval_seed, PURPOSE_FAST))


def score_window(state: ValidatorState, scorer: Scorer, evidence: WindowEvidence) -> WindowReport:
    """Score ``evidence.window``.  ``scorer.model`` must hold θ_t (the model the miners trained from) and holds it
    again on return; ``state`` is updated all-or-nothing."""
    window, hp = evidence.window, scorer.hp
    if window <= state.window:
        raise WindowAlreadyScored(f"window {window} is not after the last scored window {state.window}")
    committed, state = state, copy.deepcopy(state)  # all-or-nothing: an exception leaves the state untouched
    active_uids = _register(state, evidence.active)
    notes: list[str] = []

    # --- 1. fast checks on F_t
    fast = plan_fast_set(state, hp, window, active_uids, evidence.eval_seed, scorer.schedule)
    failures, sync_scores, passed = _fast_checks(state, scorer, evidence, fast)
    for uid, failure in failures.items():
        _penalise(state.peers[uid], failure, hp, window)
    banned = {uid for uid in active_uids if is_banned(state.peers[uid], hp)}

    # --- 2. primary evaluation on S_t (a banned peer's slot would be wasted)
    chosen = selection.eval_set([uid for uid in passed if uid not in banned],
                                lambda uid: state.peers[uid].last_eval_window, hp.eval_peers,
                                scorer.schedule.picker(state, hp, window, evidence.eval_seed, PURPOSE_EVAL))
    reference = _reference(scorer.codec, hp, evidence.payloads, evidence.reference_norms)
    losses, base_rand = _evaluate(state, scorer, evidence, chosen, reference, failures, notes)
    median = formulas.help_median(pl.delta_rand for pl in losses.values())
    for uid, peer_losses in losses.items():
        record_evaluation(state.peers[uid], _evaluation(peer_losses, evidence.payloads[uid]), median, hp)
    new_ratings = rate_match({uid: state.peers[uid].rating for uid in losses},
                             {uid: pl.delta_rand for uid, pl in losses.items()}, hp.rating_beta, hp.rating_tau)
    for uid, (mu, sigma) in new_ratings.items():
        state.peers[uid].rating_mu, state.peers[uid].rating_sigma = mu, sigma

    # --- 3. standing, pay, next top-G
    banned |= {uid for uid in active_uids if is_banned(state.peers[uid], hp)}  # (an evaluation may ban too)
    # nothing for a banned peer, one that failed a check this window, or one whose last evaluated update did not
    # lower the random-data loss — a peer that turns bad loses its weight at its next evaluation; none of them
    # enters the list below (scoring/pay.py, docs/scoring.md "Pay")
    checked = [uid for uid in passed if uid not in failures and uid not in banned]
    for uid in checked:
        state.peers[uid].passes += 1
    result = pay({uid: state.peers[uid] for uid in active_uids}, hp, state.weights, window, banned | set(failures))
    # peers whose last update did not help enter the list only when nobody else can (a cold start, where
    # every update of the warm-up may score 0), so the network never stands still for want of a list
    top = (selection.next_top_g(result.standing, [uid for uid in checked if uid not in result.unhelpful], hp.topg)
           or selection.next_top_g(result.standing, checked, hp.topg))
    state.window, state.fast, state.evaluated = window, fast, sorted(losses)
    state.top_g, state.weights = top, result.weights
    committed.__dict__.update(state.__dict__)
    return WindowReport(
        window=window, fast=fast, evaluated=sorted(losses),
        rejections={uid: str(r) for uid, r in sorted(failures.items())}, sync_scores=sync_scores,
        loss_scores={uid: pl.delta_rand for uid, pl in sorted(losses.items())},
        assigned_deltas={uid: pl.delta_assigned for uid, pl in sorted(losses.items())},
        poc_statistics={uid: pl.poc_statistic for uid, pl in sorted(losses.items())},
        base_rand_loss=base_rand, mu={uid: state.peers[uid].mu for uid in active_uids},
        loss_ratings=result.ratings, scores=result.scores, weights=result.weights, top_g=top, notes=notes)


def _evaluation(losses: PeerLosses, payload: Payload) -> Evaluation:
    return Evaluation(losses.delta_rand, losses.delta_assigned, losses.poc_statistic, payload.meta.trained)


def _fast_checks(state: ValidatorState, scorer: Scorer, evidence: WindowEvidence,
                 fast: list[int]) -> tuple[dict[int, Rejection], dict[int, float], list[int]]:
    """(failures, SyncScores, peers that passed) of the fast checks on F_t."""
    hp, window = scorer.hp, evidence.window
    unit = evidence.sync_unit if evidence.sync_unit is not None and evidence.sync_unit > 0 else \
        learning_rate(hp, window)
    positions = sync_positions(evidence.randomness, parameter_shapes(scorer.model), sync_sample_count(hp))
    reference = sample_parameters(dict(scorer.model.named_parameters()), positions).tolist()
    failures: dict[int, Rejection] = {}
    sync_scores: dict[int, float] = {}
    passed: list[int] = []
    for uid in fast:
        state.peers[uid].last_fast_window = window
        failure = _fast_check(uid, evidence.payloads, evidence.rejections, reference, unit, hp, sync_scores)
        if failure is None:
            passed.append(uid)
        else:
            failures[uid] = failure
    return failures, sync_scores, passed


# ------------------------------------------------------------------ steps
def _reference(codec: Codec, hp: HParams, payloads: Mapping[int, Payload],
               given: Mapping[str, float] | None) -> dict[str, float]:
    """Reference norms of the evaluation step: the caller's, or the median over the window's updates."""
    if given is not None or outer_rule(hp).signs:  # the signed step takes no reference norm
        return dict(given or {})
    norms = []
    for payload in payloads.values():
        try:
            norms.append(peer_norms(codec, payload.update))
        except Exception:  # noqa: BLE001 — a hostile update is rejected when it is evaluated, not here
            continue
    return reference_norms(norms, list(codec.shapes))


def _peer_or_new(state: ValidatorState, uid: int) -> PeerState:
    return state.peers.get(uid) or PeerState()


def _register(state: ValidatorState, active: Mapping[int, str] | Iterable[int]) -> list[int]:
    """Create state for new uids; a uid now held by another hotkey starts from scratch."""
    hotkeys = dict(active) if isinstance(active, Mapping) else {uid: "" for uid in active}
    for uid, hotkey in hotkeys.items():
        peer = state.peer(uid)
        if hotkey and peer.hotkey and peer.hotkey != hotkey:
            state.peers[uid] = PeerState(hotkey=hotkey)
        elif hotkey:
            peer.hotkey = hotkey
    return sorted(hotkeys)


def _fast_check(uid: int, payloads: Mapping[int, Payload], rejections: Mapping[int, Rejection],
                reference: list[float], lr: float, hp: HParams, sync_scores: dict[int, float]) -> Rejection | None:
    if uid in rejections:
        given = rejections[uid]
        return given if isinstance(given, Rejection) else Rejection(Reason.MALFORMED, str(given))
    payload = payloads.get(uid)
    if payload is None:
        return Rejection(Reason.MISSING, "no payload this window")
    bad = check_sync_vector(payload.sync_values, sync_sample_count(hp))
    if bad is not None:
        return bad
    score = formulas.sync_score(reference, payload.sync_values.tolist(), lr)
    sync_scores[uid] = score
    if not score <= hp.sync_threshold:
        return Rejection(Reason.OUT_OF_SYNC, f"SyncScore {score:.3g} > {hp.sync_threshold:g}")
    return None


INVALID = "invalid"  # offences key: invalid updates so far (commit-reveal runs), toward the ban
NO_WORK = (Reason.DUPLICATE, Reason.REPLAY, Reason.EMPTY)  # an upload that took no work this window: a copy


def penalty_multiplier(failure: Rejection, peer: PeerState, hp: HParams) -> float:
    """The φ of this failure: the Gauntlet fast-check φ, or with commit-reveal on the ZIP-407 table
    (dso.protocol.commit.penalty_for), escalating with the peer's earlier invalid updates."""
    if not hp.commit_reveal:
        return hp.fast_penalty
    return commit_penalty(failure.reason, peer.offences.get(INVALID, 0), hp.fast_penalty)


def is_banned(peer: PeerState, hp: HParams) -> bool:
    return bool(hp.commit_reveal) and peer.offences.get(INVALID, 0) >= BAN_AFTER


def _penalise(peer: PeerState, failure: Rejection, hp: HParams, window: int) -> None:
    """One penalty (the caller guarantees at most one per peer per window); never raises μ.  An upload that
    certainly took no work this window (a replay, an empty update) starts the proof of computation's cooldown,
    as a failed test does."""
    peer.mu = formulas.penalise(peer.mu, penalty_multiplier(failure, peer, hp))
    if failure.reason in NO_WORK:  # the record the pay rule reads (scoring/pay.py); μ moves by the table
        peer.copies += 1
    if failure.reason in (Reason.REPLAY, Reason.EMPTY):
        peer.poc_failed_window = window
    peer.offences[failure.category] = peer.offences.get(failure.category, 0) + 1
    if hp.commit_reveal and is_invalid_update(failure.reason):
        peer.offences[INVALID] = peer.offences.get(INVALID, 0) + 1
    peer.last_offence = str(failure)


def _evaluate(state: ValidatorState, scorer: Scorer, evidence: WindowEvidence, chosen: list[int],
              reference: dict[str, float], failures: dict[int, Rejection],
              notes: list[str]) -> tuple[dict[int, PeerLosses], float | None]:
    """Losses of every peer in ``chosen`` whose update decodes (the others are penalised here), and the mean loss of
    the random sequences at θ_t.  The public eval seed (under the drawn schedule; scoring/schedules.py) draws which of
    each peer's trained sequences are tested, and the random ones."""
    if not chosen:
        return {}, None
    model, hp, window = scorer.model, scorer.hp, evidence.window
    rng = scorer.schedule.data_rng(state, window, evidence.eval_seed)
    trained = {uid: _trained_sample(scorer, evidence, uid, rng) for uid in chosen}  # uid order: rng draws in order
    exclude = np.concatenate([scorer.dataset.assigned_rows(uid, window, hp.assigned_sequences) for uid in chosen])
    rand = scorer.dataset.unassigned(rng, exclude, hp.eval_sequences)
    snapshot = ParameterSnapshot(model)
    random = random_losses(model, snapshot, evidence.control, rand, hp.micro_batch)
    base_mean = float(random.base.mean()) if random.base.numel() else math.nan
    if not math.isfinite(base_mean):
        notes.append(f"validator loss on D_rand is {base_mean}: evaluation skipped this window")
        return {}, base_mean
    for uid in chosen:
        state.peers[uid].last_eval_window = window
    shared = SharedInputs(window, reference, parameter_shapes(model), evidence.control, random)
    jobs = {uid: (evidence.payloads[uid].update, trained[uid]) for uid in chosen}
    results = (scorer.evaluator or evaluate_peers)(model, snapshot, scorer.codec, hp, shared, jobs)
    losses = {}
    for uid in chosen:
        got = results[uid]
        if isinstance(got, Rejection):
            if uid not in failures:  # at most one penalty per peer per window
                failures[uid] = got
                _penalise(state.peers[uid], got, hp, window)
            continue
        losses[uid] = got
    return losses, base_mean


def poc_sample_size(hp: HParams, declared: int) -> int:
    """How many of the ``declared`` trained sequences the proof of computation tests: ``poc_fraction`` of them, at
    least ``poc_sequences`` (all, when fewer were declared).  A larger share of the work spreads each sequence's
    trace in the update thinner; testing more of them keeps the test's power."""
    return min(declared, max(hp.poc_sequences, math.ceil(hp.poc_fraction * declared)))


def _trained_sample(scorer: Scorer, evidence: WindowEvidence, uid: int, rng: np.random.Generator) -> torch.Tensor:
    """``poc_sample_size`` of the sequences the peer declared it trained on (the first ``trained`` of its
    assignment, at most the whole), drawn by ``rng``; none when it declared fewer than two (no test: it fails)."""
    hp = scorer.hp
    declared = min(evidence.payloads[uid].meta.trained, hp.assigned_sequences)
    rows = scorer.dataset.assigned_rows(uid, evidence.window, hp.assigned_sequences)[:declared]
    if rows.size < 2:
        return torch.zeros((0, hp.model.seq_len + 1), dtype=torch.int64)
    pick = np.sort(rng.choice(rows.size, size=poc_sample_size(hp, int(rows.size)), replace=False))
    return torch.from_numpy(scorer.dataset.rows(rows[pick]))
