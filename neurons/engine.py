"""The pure part of a validator window: aggregate → copies → scoring → contributions → ledger record.

:func:`run_window` is a function of explicit inputs: the validator's scoring
state, the model at θ_t, the run's codec, data and hyper-parameters, and what
the transport produced for the window (payloads that passed the strict checks,
and rejections).  It advances the model to θ_{t+1} in place and returns what the
caller publishes.  The validator process (neurons/validator.py) wraps it in I/O;
the in-process simulator (sim/simulator.py) drives the very same function, so
the two cannot drift apart.

Order within a window:

1. the aggregate: the list in effect for the window ∩ the payloads, under the
   run's rule, applied with the run's outer rule (dso/training/outer.py: the Gauntlet's
   signed step, or an optimiser step whose state — ``OuterState`` — every node
   carries next to θ) (θ_t → θ_{t+1}); ``on_aggregate`` lets
   the caller publish it (the window's bundle, storage/aggregate.py) before the
   slower rest, since every other node waits for it.  A validator that does not
   lead aggregates the leader's bundle instead of its own view
   (``WindowInputs.bundle``), so every node holds the same θ_{t+1};
2. copy detection at θ_t (identical or near-identical contents, mixes of peers, copies of the
   previous aggregate; the upload the validator saw first or, seen together, proof of computation
   keeps it — scoring/copies.py);
3. scoring at θ_t (fast checks, primary evaluation with the outer rule's
   evaluation step, ratings, weights, next list);
4. contributions (ZIP-400) of every update read, and the provenance record.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dso.aggregation.contribution import Contribution, round_contributions
from dso.aggregation.robust import AggregationInfo, decoded_rows
from dso.codec.codecs import Codec, Update
from dso.config.schema import HParams
from dso.data.dataset import Dataset
from dso.nn.model import Decoder
from dso.protocol.payload import Payload
from dso.protocol.provenance import make_record
from dso.protocol.rejections import Rejection
from dso.training.outer import OuterState, aggregate, outer_lr
from dso.training.outer_rules import outer_rule
from dso.training.train import learning_rate
from neurons.theta import Theta, as_theta
from scoring.copies import assigned_gains, find_copies
from scoring.evaluation import ParameterSnapshot, PeerEvaluator
from scoring.history import find_replays
from scoring.schedules import DRAWN, EvalSchedule
from scoring.state import ValidatorState
from scoring.window import Scorer, WindowEvidence, WindowReport, score_window

LIST_LEAD = 2  # the top-G list scored in window t governs window t + 2: a full window of slack (docs/protocol.md)


@dataclass(frozen=True)
class WindowInputs:
    """What the transport and the chain gave the validator for window ``window``."""

    window: int
    payloads: Mapping[int, Payload]        # passed the strict format and timing checks
    rejections: Mapping[int, Rejection]    # transport-level failures (missing, late, malformed, ...)
    active: Mapping[int, str]              # peers to score: uid → hotkey
    aggregation_list: Sequence[int]        # the top-G list in effect for the window
    randomness: bytes                      # the window's chain randomness (sync positions)
    eval_seed: bytes                       # chain randomness after the uploads closed: draws F_t and S_t
    bundle: Mapping[int, Payload] | None = None  # the leader's payloads to aggregate, when not leading
    previous_aggregate: Mapping[str, torch.Tensor] | None = None  # window t−1's Δ (public): copying it is a copy


@dataclass
class Aggregation:
    window: int
    used: list[int]                        # uids whose updates were aggregated, in aggregation order
    payloads: dict[int, Payload]           # their payloads (what the window's bundle carries)
    delta: dict[str, torch.Tensor]         # the Δ the outer rule applied (sign(Δ) for the signed rule); kept
    #                                        only when asked (keep_delta: a validator reads it again), else empty
    learning_rate: float                   # the outer step's rate (α_t for the signed rule)
    hash_before: str                       # θ_t
    hash_after: str                        # θ_{t+1}
    info: AggregationInfo
    reference_norms: dict[str, float] = field(default_factory=dict)  # median peer norm per tensor
    moved: float = 0.0                     # mean |θ_{t+1} − θ_t| per parameter (SyncScore's unit)
    outer_before: str = ""                 # OuterState digests around the step
    outer_after: str = ""


@dataclass
class WindowOutcome:
    aggregation: Aggregation
    report: WindowReport
    rejections: dict[int, Rejection]       # transport rejections and copies
    contributions: dict[int, Contribution] = field(default_factory=dict)
    record: dict[str, Any] = field(default_factory=dict)  # provenance record


def genesis_lists(first_window: int, miners: Sequence[int], g: int) -> dict[int, list[int]]:
    """The lists of the first LIST_LEAD windows, announced before anyone was scored: the first G miners."""
    return {w: sorted(miners)[:g] for w in range(first_window, first_window + LIST_LEAD)}


def announce_list(lists: Mapping[int, list[int]], window: int, top_g: list[int]) -> dict[int, list[int]]:
    """The lists still to come after scoring ``window``: its top-G governs ``window + LIST_LEAD``."""
    upcoming = {w: uids for w, uids in lists.items() if w > window}
    upcoming[window + LIST_LEAD] = list(top_g)
    return upcoming


def aggregate_window(model: torch.nn.Module | Theta, codec: Codec, hp: HParams, window: int,
                     payloads: Mapping[int, Payload], aggregation_list: Sequence[int], outer: OuterState,
                     device: str | torch.device = "cpu", keep_delta: bool = False,
                     hash_before: str | None = None) -> Aggregation:
    """θ_t → θ_{t+1} and the outer state, in place: the run's outer step with the aggregate of the listed
    peers' payloads (bit-identical on every node for the default aggregation, dso/training/outer.py).
    ``model``: the node's model, or its θ (neurons/theta.py: a miner on ranks holds it in slices).

    Δ is decoded tensor by tensor as θ steps, each tensor freed before the next (``StreamedDelta``): a follower
    never holds the whole Δ.  ``keep_delta``: keep it in ``Aggregation.delta`` (a validator's contributions and
    its next window's copy check read it).  ``hash_before``: θ's hash when the caller has just checked it (a
    hash reads all of θ: on ranks, a gather of every tensor)."""
    theta = as_theta(model)
    used = [u for u in aggregation_list if u in payloads]
    agg = aggregate(codec, [payloads[u].update for u in used], hp, used)
    if keep_delta:
        agg.delta.keep()  # each tensor decoded once: the step reads it, and so does dict() below
    before, outer_before = hash_before or theta.hash(), outer.digest()
    moved = theta.step(agg.delta, outer, hp, window)
    kept = dict(agg.delta) if keep_delta else {}
    return Aggregation(window, used, {u: payloads[u] for u in used}, kept, outer_lr(hp, window), before,
                       theta.hash(), agg.info, agg.reference_norms, moved, outer_before, outer.digest())


def run_window(state: ValidatorState, model: Decoder, codec: Codec, dataset: Dataset, hp: HParams,
               inputs: WindowInputs, *, outer: OuterState, ledger_prev_hash: str, validator: str,
               device: str | torch.device = "cpu",
               on_aggregate: Callable[[Aggregation], None] | None = None,
               evaluator: PeerEvaluator | None = None, schedule: EvalSchedule = DRAWN) -> WindowOutcome:
    """One window.  ``model`` and ``outer`` hold θ_t and the outer state on entry, θ_{t+1} and the next state on
    return; ``state`` is updated all-or-nothing.  ``evaluator``: who computes the evaluated peers' losses
    (default: this process; a torchrun validator's ranks, neurons/validator_ranks.py).  ``schedule``: how F_t, S_t
    and the evaluation data are drawn (experiments alone pass another than the drawn one, scoring/schedules.py)."""
    t, payloads = inputs.window, inputs.payloads
    updates = {u: p.update for u, p in payloads.items()}
    uids = sorted(updates)
    step = hp.eval_scale * learning_rate(hp, t)

    # 1. the aggregate: θ_t → θ_{t+1}, published at once
    theta_t = ParameterSnapshot(model)
    to_aggregate = payloads if inputs.bundle is None else inputs.bundle
    order = inputs.aggregation_list if inputs.bundle is None else list(inputs.bundle)
    aggregation = aggregate_window(model, codec, hp, t, to_aggregate, order, outer, device, keep_delta=True)
    theta_next = ParameterSnapshot(model)
    if on_aggregate is not None:
        on_aggregate(aggregation)
    theta_t.restore()
    control = consensus_step(model, theta_t, theta_next, hp.eval_scale)
    try:
        # 2. copies, at θ_t
        rejections = dict(inputs.rejections)
        gains = assigned_gains(model, codec, dataset, hp, t, step, updates)
        previous = _previous_update(codec, inputs.previous_aggregate, t)
        # every update decoded once (sorted uids, then the previous aggregate): copy detection and the
        # contributions both read these rows
        rows = decoded_rows(codec, [updates[u] for u in uids] + ([] if previous is None else [previous]),
                            device) if uids else torch.zeros(0)
        rejections.update(find_copies(codec, updates, seen_times(payloads), gains, previous, t,
                                      inner_steps=hp.inner.mode == "steps", device=device, rows=rows))
        aggregate_row = rows[len(uids)] if previous is not None and uids else None  # decoded only beside uploads
        # rows holds the previous aggregate's row after the uploads' rows: zip stops at the uploads
        rejections.update(find_replays(state.history, t, dict(zip(uids, rows, strict=False)), aggregate_row,
                                       skip=list(rejections)))
        # 3. score window t at θ_t
        evidence = WindowEvidence(t, {u: p for u, p in payloads.items() if u not in rejections}, rejections,
                                  inputs.active, inputs.randomness, inputs.eval_seed,
                                  aggregation.reference_norms if aggregation.used else None,
                                  None if outer_rule(hp).signs else aggregation.moved, control)
        report = score_window(state, Scorer(model, codec, dataset, hp, evaluator, schedule), evidence)
    finally:
        theta_next.restore()
    del theta_t, theta_next, control

    # 4. contributions and the provenance record
    contributions = _contributions(codec, rows[:len(uids)], uids, aggregation.delta, report)
    record = make_record(t, aggregation.hash_before, aggregation.hash_after,
                         [{"uid": u, "score": report.scores.get(u, 0.0), "weight": report.weights.get(u, 0.0),
                           "contribution": contributions[u].score} for u in aggregation.used],
                         ledger_prev_hash, validator, extra={"rule": aggregation.info.rule})
    return WindowOutcome(aggregation, report, rejections, contributions, record)


def consensus_step(model: torch.nn.Module, theta_t: ParameterSnapshot, theta_next: ParameterSnapshot,
                   scale: float) -> dict[str, torch.Tensor]:
    """``scale · (θ_t − θ_{t+1})``: the window's aggregate as an evaluation step, the control the proof of computation
    compares each peer's step with (scoring/evaluation.py)."""
    names = [name for name, _ in model.named_parameters()]
    return {name: scale * (before - after)
            for name, before, after in zip(names, theta_t.copies, theta_next.copies, strict=True)}


def seen_times(payloads: Mapping[int, Payload]) -> dict[int, float]:
    """When the validator itself first saw each payload (``Payload.seen``): the copy tie-break's order.  Never
    the peer's own LastModified, which a peer serving its own bucket can forge; not observed = seen together."""
    return {u: p.seen if p.seen is not None else 0.0 for u, p in payloads.items()}


def _previous_update(codec: Codec, delta: Mapping[str, torch.Tensor] | None, window: int) -> Update | None:
    """The previous aggregate as a copier would upload it: compressed by the run's codec."""
    if not delta or set(delta) != set(codec.shapes):
        return None
    return codec.compress({n: delta[n].detach().float().cpu() for n in codec.shapes}, window)


def _contributions(codec: Codec, rows: torch.Tensor, uids: Sequence[int], delta: Mapping[str, torch.Tensor],
                   report: WindowReport) -> dict[int, Contribution]:
    """ZIP-400 contribution of every peer whose update was read this window (``rows``: their decoded rows)."""
    if not uids:
        return {}
    aggregate = torch.cat([delta[n].reshape(-1) for n in codec.shapes])
    return round_contributions(dict(zip(uids, rows, strict=True)), aggregate, report.mu, report.loss_scores)
