"""One Gauntlet window on the validator: fast checks, primary evaluation, ratings, weights.

:func:`score_window` is the single entry point the validator process calls per
window, after gathering the window's payloads and *before* applying the
window's aggregate (``model`` must hold θ_t, the model the miners trained on).
It updates ``state`` all-or-nothing (the caller saves it afterwards) and
returns a :class:`WindowReport`.  Order, as in the paper's Algorithm 1:

1. F_t: current top-G + peers drawn from ``eval_seed`` (scoring/selection.py).  Each gets the fast
   checks — a rejection from the gatherer, no payload, a malformed sync vector,
   or SyncScore above ``sync_threshold`` — and at most one penalty on μ.
2. S_t ⊆ peers that passed, drawn the same way: ``L(θ_t, D_rand)`` once, then per peer three
   forward passes, in place; LossScore = δ_rand; μ gets the proof-of-computation
   update; one OpenSkill match over S_t updates the ratings.
3. Sign-safe PeerScores for the active peers → power-normalised weights, smoothed
   with the last posted ones (``hp.weight_smoothing``) → next top-G list.

With ``hp.commit_reveal`` on, penalties follow the ZIP-407 table mapped onto μ
(:func:`penalty_multiplier`, docs/extensions.md §2): a commit-reveal offence, a
copy or an invalid update costs more than the plain φ, every invalid update is
counted (``offences["invalid"]``), and the third one bans the uid — μ drops to
zero or below, and it gets no weight and no place in the top-G list until its
hotkey changes.

Model access: ``named_parameters`` (snapshot, in-place step, restore) and
``model.loss`` through :func:`dso.train.evaluate`.  Dataset access:
``assigned_rows``/``assigned`` of the evaluated peers and one ``unassigned`` draw.
"""
from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np
import torch

from dso.commit import BAN_AFTER, commit_penalty, is_invalid_update
from dso.config import HParams
from dso.codecs import Codec
from dso.model import Decoder, parameter_shapes, sync_sample_count
from dso.rejections import Reason, Rejection
from dso.train import evaluate, learning_rate
from scoring import formulas, selection
from dso.outer import peer_norms, reference_norms
from scoring.evaluation import PeerEvaluator, PeerLosses, evaluate_peers
from scoring.pay import pay, record_evaluation
from scoring.rating import rate_match
from scoring.state import PeerState, ValidatorState
from scoring.sync import check_sync_vector, sample_parameters, sync_positions

if TYPE_CHECKING:
    from dso.data import Dataset

# Purposes of the validator's private per-window randomness (never reuse a number).
PURPOSE_FAST, PURPOSE_EVAL, PURPOSE_DATA = 1, 2, 3


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
    base_rand_loss: float | None          # L(θ_t, D_rand), None when nobody was evaluated
    mu: dict[int, float]                  # every active peer, after this window
    loss_ratings: dict[int, float]
    scores: dict[int, float]              # sign-safe PeerScore
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


def picker(state: ValidatorState, hp: HParams, window: int, eval_seed: bytes, purpose: int) -> selection.Picker:
    """How F_t (purpose PURPOSE_FAST) or S_t (PURPOSE_EVAL) fills its slots under ``hp.eval_schedule``."""
    if hp.eval_schedule == "round_robin":
        return selection.least_recent_picker(state.rng(window, purpose))
    return selection.drawn_picker(window, eval_seed, b"fast" if purpose == PURPOSE_FAST else b"eval",
                                  hp.eval_max_gap_factor)


def data_rng(state: ValidatorState, hp: HParams, window: int, eval_seed: bytes) -> np.random.Generator:
    """Which assigned sequences and which D_rand the evaluation uses: drawn from the public eval seed under the
    random schedule (every validator scores on the same data, so their ratings agree — issue 16), from the
    validator's private secret under the round-robin baseline (whose schedule is predictable anyway)."""
    if hp.eval_schedule == "random":
        return selection.public_rng(window, eval_seed, b"data")
    return state.rng(window, PURPOSE_DATA)


def plan_fast_set(state: ValidatorState, hp: HParams, window: int, active: Iterable[int],
                  eval_seed: bytes) -> list[int]:
    """F_t, for a validator that wants to download only those payloads.  Same answer as inside
    :func:`score_window` as long as ``state`` has not changed in between."""
    active = sorted(set(active))
    return selection.fast_set(state.top_g, active, lambda uid: _peer_or_new(state, uid).last_fast_window,
                              hp.fast_peers, picker(state, hp, window, eval_seed, PURPOSE_FAST))


def score_window(state: ValidatorState, model: Decoder, codec: Codec, dataset: Dataset, hp: HParams,
                 window: int, payloads: Mapping[int, tuple[Any, torch.Tensor]],
                 rejections: Mapping[int, Rejection], active: Mapping[int, str] | Iterable[int],
                 randomness: bytes, eval_seed: bytes, reference_norms: Mapping[str, float] | None = None,
                 sync_unit: float | None = None, evaluator: PeerEvaluator | None = None) -> WindowReport:
    """Score window ``window``; ``active`` is the registered uids (or uid → hotkey, which also resets a
    uid whose hotkey changed); ``randomness`` is the chain randomness of the window (sync positions);
    ``eval_seed`` the chain randomness of a block produced after the window's uploads closed, which draws
    F_t and S_t (``dso.clock.Clock.eval_randomness``).

    ``reference_norms`` (per tensor) sizes the evaluation step of the optimiser outer rules
    (dso.outer.evaluation_step: the aggregate's median peer norm; None = the median over the updates
    scored here); ``sync_unit`` is SyncScore's unit, the mean |θ_{t+1} − θ_t| of the
    window's outer step (default: α_t, one signed step); ``evaluator`` computes the evaluated peers' losses
    (scoring.evaluation.PeerEvaluator; default: this process, one peer after another)."""
    if window <= state.window:
        raise WindowAlreadyScored(f"window {window} is not after the last scored window {state.window}")
    committed, state = state, copy.deepcopy(state)  # all-or-nothing: an exception leaves the state untouched
    active_uids = _register(state, active)
    notes: list[str] = []

    # --- 1. fast checks on F_t
    fast = plan_fast_set(state, hp, window, active_uids, eval_seed)
    shapes = parameter_shapes(model)
    lr = learning_rate(hp, window)
    unit = sync_unit if sync_unit is not None and sync_unit > 0 else lr
    positions = sync_positions(randomness, shapes, sync_sample_count(hp))
    reference = sample_parameters(dict(model.named_parameters()), positions).tolist()
    failures: dict[int, Rejection] = {}
    sync_scores: dict[int, float] = {}
    passed: list[int] = []
    for uid in fast:
        state.peers[uid].last_fast_window = window
        failure = _fast_check(uid, payloads, rejections, reference, unit, hp, sync_scores)
        if failure is None:
            passed.append(uid)
        else:
            failures[uid] = failure
    for uid, failure in failures.items():
        _penalise(state.peers[uid], failure, hp)
    banned = {uid for uid in active_uids if is_banned(state.peers[uid], hp)}

    # --- 2. primary evaluation on S_t (a banned peer's slot would be wasted)
    chosen = selection.eval_set([uid for uid in passed if uid not in banned],
                                lambda uid: state.peers[uid].last_eval_window, hp.eval_peers,
                                picker(state, hp, window, eval_seed, PURPOSE_EVAL))
    losses, base_rand = _evaluate(state, model, codec, dataset, hp, window, chosen, payloads, shapes,
                                  _reference(codec, hp, payloads, reference_norms), failures, notes,
                                  data_rng(state, hp, window, eval_seed), evaluator)
    median = formulas.help_median(pl.delta_rand for pl in losses.values())
    for uid, peer_losses in losses.items():
        record_evaluation(state.peers[uid], peer_losses.delta_rand, peer_losses.delta_assigned, median, hp)
    new_ratings = rate_match({uid: state.peers[uid].rating for uid in losses},
                             {uid: pl.delta_rand for uid, pl in losses.items()}, hp.rating_beta, hp.rating_tau)
    for uid, (mu, sigma) in new_ratings.items():
        state.peers[uid].rating_mu, state.peers[uid].rating_sigma = mu, sigma

    # --- 3. scores, weights, next top-G
    banned |= {uid for uid in active_uids if is_banned(state.peers[uid], hp)}  # (an evaluation may ban too)
    # nothing for a banned peer, one that failed a check this window, or one whose last evaluated update did not
    # lower the random-data loss — a peer that turns bad loses its weight at its next evaluation, however good
    # its rating (scoring/pay.py, docs/scoring.md "Fair, stable weights"); none of them enters the list below
    checked = [uid for uid in passed if uid not in failures and uid not in banned]
    for uid in checked:
        state.peers[uid].passes += 1
    ratings, scores, weights, unhelpful = pay({uid: state.peers[uid] for uid in active_uids}, hp, state.weights,
                                              banned | set(failures))
    # peers whose last update did not help enter the list only when nobody else can (a cold start, where
    # every update of the warm-up may score 0), so the network never stands still for want of a list
    top = (selection.next_top_g(scores, [uid for uid in checked if uid not in unhelpful], hp.topg)
           or selection.next_top_g(scores, checked, hp.topg))
    state.window, state.fast, state.evaluated = window, fast, sorted(losses)
    state.top_g, state.weights = top, weights
    committed.__dict__.update(state.__dict__)
    return WindowReport(
        window=window, fast=fast, evaluated=sorted(losses),
        rejections={uid: str(r) for uid, r in sorted(failures.items())}, sync_scores=sync_scores,
        loss_scores={uid: pl.delta_rand for uid, pl in sorted(losses.items())},
        assigned_deltas={uid: pl.delta_assigned for uid, pl in sorted(losses.items())},
        base_rand_loss=base_rand, mu={uid: state.peers[uid].mu for uid in active_uids},
        loss_ratings=ratings,
        scores=scores, weights=weights, top_g=top, notes=notes)


# ------------------------------------------------------------------ steps
def _reference(codec: Any, hp: HParams, payloads: Mapping[int, Any],
               given: Mapping[str, float] | None) -> dict[str, float]:
    """Reference norms of the evaluation step: the caller's, or the median over the window's updates."""
    if given is not None or hp.outer.rule == "signed":
        return dict(given or {})
    norms = []
    for payload in payloads.values():
        try:
            norms.append(peer_norms(codec, payload[0]))
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


def _fast_check(uid: int, payloads: Mapping[int, Any], rejections: Mapping[int, Rejection], reference: list[float],
                lr: float, hp: HParams, sync_scores: dict[int, float]) -> Rejection | None:
    if uid in rejections:
        given = rejections[uid]
        return given if isinstance(given, Rejection) else Rejection(Reason.MALFORMED, str(given))
    payload = payloads.get(uid)
    if payload is None:
        return Rejection(Reason.MISSING, "no payload this window")
    if not (isinstance(payload, tuple) and len(payload) == 2):
        return Rejection(Reason.MALFORMED, "payload is not (update, sync samples)")
    bad = check_sync_vector(payload[1], sync_sample_count(hp))
    if bad is not None:
        return bad
    score = formulas.sync_score(reference, payload[1].tolist(), lr)
    sync_scores[uid] = score
    if not score <= hp.sync_threshold:
        return Rejection(Reason.OUT_OF_SYNC, f"SyncScore {score:.3g} > {hp.sync_threshold:g}")
    return None


INVALID = "invalid"  # offences key: invalid updates so far (commit-reveal runs), toward the ban


def penalty_multiplier(failure: Rejection, peer: PeerState, hp: HParams) -> float:
    """The φ of this failure: the Gauntlet fast-check φ, or with commit-reveal on the ZIP-407 table
    (dso.commit.penalty_for), escalating with the peer's earlier invalid updates."""
    if not hp.commit_reveal:
        return hp.fast_penalty
    return commit_penalty(failure.reason, peer.offences.get(INVALID, 0), hp.fast_penalty)


def is_banned(peer: PeerState, hp: HParams) -> bool:
    return bool(hp.commit_reveal) and peer.offences.get(INVALID, 0) >= BAN_AFTER


def _penalise(peer: PeerState, failure: Rejection, hp: HParams) -> None:
    """One penalty (the caller guarantees at most one per peer per window); never raises μ."""
    peer.mu = formulas.penalise(peer.mu, penalty_multiplier(failure, peer, hp))
    if failure.reason is Reason.DUPLICATE:  # the record the pay rule reads (scoring/pay.py); μ moves by the table
        peer.copies += 1
    peer.offences[failure.category] = peer.offences.get(failure.category, 0) + 1
    if hp.commit_reveal and is_invalid_update(failure.reason):
        peer.offences[INVALID] = peer.offences.get(INVALID, 0) + 1
    peer.last_offence = str(failure)


def _evaluate(state: ValidatorState, model: Decoder, codec: Codec, dataset: Dataset, hp: HParams, window: int,
              chosen: list[int], payloads: Mapping[int, Any], shapes: Mapping[str, tuple[int, ...]],
              reference: dict[str, float], failures: dict[int, Rejection], notes: list[str],
              rng: np.random.Generator, evaluator: PeerEvaluator | None = None
              ) -> tuple[dict[int, PeerLosses], float | None]:
    """Losses of every peer in ``chosen`` whose update decodes (the others are penalised here); ``rng`` draws
    the evaluated sequences (:func:`data_rng`)."""
    if not chosen:
        return {}, None
    assigned: dict[int, torch.Tensor] = {}
    for uid in chosen:  # uid order: the rng draws must not depend on dict order
        batch = dataset.assigned(uid, window, hp.assigned_sequences)
        pick = np.sort(rng.choice(batch.shape[0], size=min(hp.eval_sequences, batch.shape[0]), replace=False))
        assigned[uid] = batch[torch.from_numpy(pick)]
    exclude = np.concatenate([dataset.assigned_rows(uid, window, hp.assigned_sequences) for uid in chosen])
    rand = dataset.unassigned(rng, exclude, hp.eval_sequences)
    base_rand = evaluate(model, rand, hp.micro_batch, next(model.parameters()).device)
    if not math.isfinite(base_rand):
        notes.append(f"validator loss on D_rand is {base_rand}: evaluation skipped this window")
        return {}, base_rand
    results = (evaluator or evaluate_peers)(model, codec, hp, window, reference, shapes,
                                            {uid: (payloads[uid][0], assigned[uid]) for uid in chosen}, rand,
                                            base_rand)
    losses = {}
    for uid in chosen:
        state.peers[uid].last_eval_window = window
        got = results[uid]
        if isinstance(got, Rejection):
            if uid not in failures:  # at most one penalty per peer per window
                failures[uid] = got
                _penalise(state.peers[uid], got, hp)
            continue
        losses[uid] = got
    return losses, base_rand
