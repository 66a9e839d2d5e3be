"""Primary evaluation of one peer's update, in place on the validator's model.

``θ'_p = θ_t − step_p`` (:func:`update_step`: the outer rule's step with the peer's update, scaled by
``eval_scale``; ``β_eval·sign(Δ_p)`` for the Gauntlet's signed rule) is applied to the live parameters, the losses
are measured sequence by sequence, and θ_t is put back **bit-exactly** from one snapshot taken per
window (``p.copy_(snapshot)``; undoing with ``+ β·sign`` would not round-trip in
floating point, and the validator's model hash must keep matching the miners').
Memory: one parameter copy per window plus one decoded update at a time.

Cost per peer: forward passes over ``poc_sequences`` of the sequences it trained on, at θ_t and at θ', and over the
window's ``eval_sequences`` random ones at θ'; the random ones at θ_t are measured once per window and shared.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from dso.config.schema import HParams
from dso.nn.model import Decoder
from dso.protocol.rejections import Reason, Rejection
from dso.training.outer import evaluation_step, peer_norms
from dso.training.train import sequence_losses
from scoring.formulas import loss_delta, poc_statistic


class ParameterSnapshot:
    """One exact copy of θ_t for a window; :meth:`restore` writes it back with ``copy_``."""

    def __init__(self, model: Decoder):
        self.params = [p for _, p in model.named_parameters()]
        self.copies = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def restore(self) -> None:
        for p, saved in zip(self.params, self.copies, strict=True):
            p.copy_(saved)


def decoded_update(decode: Callable[[object], Mapping[str, torch.Tensor]], update: object,
                   shapes: Mapping[str, tuple[int, ...]]) -> dict[str, torch.Tensor] | Rejection:
    """A decoded update, one finite tensor per parameter — or why it cannot be used.

    ``decode`` is the codec's ``decompress``; any exception it raises on a
    hostile update becomes a format rejection instead of escaping."""
    try:
        dense = decode(update)
    except Exception as exc:  # noqa: BLE001 — untrusted input must never stop the validator
        return Rejection(Reason.MALFORMED, f"update does not decode: {type(exc).__name__}: {exc}")
    if not isinstance(dense, Mapping) or set(dense) != set(shapes):
        return Rejection(Reason.BAD_KEYS, "decoded update does not cover exactly the model's parameters")
    out: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        tensor = dense[name]
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != tuple(shape):
            return Rejection(Reason.BAD_SHAPE, f"decoded {name} has the wrong shape")
        if not bool(torch.isfinite(tensor).all()):
            return Rejection(Reason.NON_FINITE, f"decoded {name} holds NaN or inf")
        out[name] = tensor
    return out


def update_signs(decode: Callable[[object], Mapping[str, torch.Tensor]], update: object,
                 shapes: Mapping[str, tuple[int, ...]]) -> dict[str, torch.Tensor] | Rejection:
    """``sign`` of a decoded update, one tensor per parameter — or why it cannot be used."""
    dense = decoded_update(decode, update, shapes)
    return dense if isinstance(dense, Rejection) else {n: torch.sign(t) for n, t in dense.items()}


def update_step(codec: Any, update: object, hp: HParams, window: int, reference: Mapping[str, float],
                shapes: Mapping[str, tuple[int, ...]]) -> dict[str, torch.Tensor] | Rejection:
    """What the validator subtracts from θ_t to score one update: :func:`dso.training.outer.evaluation_step`, the
    step the network's outer rule would take with it (``c·α·sign(Δ_p)`` for the signed rule)."""
    dense = decoded_update(codec.decompress, update, shapes)
    if isinstance(dense, Rejection):
        return dense
    try:
        norms = peer_norms(codec, update)
    except Exception as exc:  # noqa: BLE001 — as above: a hostile update is a rejection
        return Rejection(Reason.MALFORMED, f"update values unreadable: {type(exc).__name__}: {exc}")
    return evaluation_step(hp, window, dense, norms, reference)


@dataclass(frozen=True)
class PeerLosses:
    """The per-sequence losses of one evaluation (float64): at θ_t (``base``), at θ'_p = θ_t − step_p (``stepped``)
    and at θ_t − control (``control``: the same step with the window's consensus, the aggregate, instead of the
    peer's update)."""

    control_assigned: torch.Tensor  # the sequences the peer declared it trained on (a sample)
    stepped_assigned: torch.Tensor
    base_rand: torch.Tensor         # the window's random sequences: shared by every evaluated peer
    control_rand: torch.Tensor      # (shared)
    stepped_rand: torch.Tensor

    @property
    def delta_rand(self) -> float:
        """LossScore: how much the peer's step lowers the loss of random sequences."""
        return loss_delta(_mean(self.base_rand), _mean(self.stepped_rand))

    @property
    def delta_assigned(self) -> float:
        """How much more the peer's step lowers the loss of its trained sequences than the consensus step does."""
        return loss_delta(_mean(self.control_assigned), _mean(self.stepped_assigned))

    @property
    def poc_statistic(self) -> float:
        """The proof of computation (``formulas.poc_statistic``): the per-sequence gains of the peer's step over the
        consensus step, on its trained sequences against the random ones.  The consensus cancels what makes one
        sequence (or one window's random draw) easier to improve than another for any good update; what is left
        on the trained sequences is what training on them put into the update."""
        return poc_statistic((self.control_assigned - self.stepped_assigned).tolist(),
                             (self.control_rand - self.stepped_rand).tolist())


def _mean(losses: torch.Tensor) -> float:
    return float(losses.mean()) if losses.numel() else float("nan")


@dataclass(frozen=True)
class RandomLosses:
    """The window's random sequences and their losses at θ_t and at θ_t − control, measured once."""

    batch: torch.Tensor
    base: torch.Tensor
    control: torch.Tensor


def stepped_losses(model: Decoder, snapshot: ParameterSnapshot, step: Mapping[str, torch.Tensor] | None,
                   batches: Sequence[torch.Tensor], micro_batch: int) -> list[torch.Tensor]:
    """Per-sequence losses of each of ``batches`` at θ_t − ``step`` (θ_t itself for None).

    ``model`` must hold θ_t on entry; it holds θ_t again (bit for bit) on return, also when a forward pass
    raises."""
    device = snapshot.params[0].device
    try:
        if step is not None:
            with torch.no_grad():
                for (name, p) in model.named_parameters():
                    p.sub_(step[name].to(device=p.device, dtype=p.dtype))
        return [sequence_losses(model, batch, micro_batch, device) for batch in batches]
    finally:
        if step is not None:
            snapshot.restore()


def random_losses(model: Decoder, snapshot: ParameterSnapshot, control: Mapping[str, torch.Tensor] | None,
                  batch: torch.Tensor, micro_batch: int) -> RandomLosses:
    """The random side of a window's evaluations (no control: the control losses are the base ones)."""
    base = stepped_losses(model, snapshot, None, [batch], micro_batch)[0]
    controlled = base if control is None else stepped_losses(model, snapshot, control, [batch], micro_batch)[0]
    return RandomLosses(batch, base, controlled)


def evaluate_peer(model: Decoder, snapshot: ParameterSnapshot, step: Mapping[str, torch.Tensor],
                  control: Mapping[str, torch.Tensor] | None, assigned: torch.Tensor, rand: RandomLosses,
                  micro_batch: int) -> PeerLosses:
    """Per-sequence losses of the peer's step and of the control step on its trained sequences (``assigned``, may
    be empty), and of the peer's step on the window's random ones."""
    stepped_assigned, stepped_rand = stepped_losses(model, snapshot, step, [assigned, rand.batch], micro_batch)
    control_assigned = stepped_losses(model, snapshot, control, [assigned], micro_batch)[0]
    return PeerLosses(control_assigned, stepped_assigned, rand.base, rand.control, stepped_rand)


@dataclass(frozen=True)
class SharedInputs:
    """What every evaluated peer of one window shares: the step's reference norms, the parameter shapes, the
    consensus step (``control``) and the window's random sequences with their losses at θ_t and θ_t − control."""

    window: int
    reference: Mapping[str, float]
    shapes: Mapping[str, tuple[int, ...]]
    control: Mapping[str, torch.Tensor] | None
    random: RandomLosses


class PeerEvaluator(Protocol):
    """Who computes the losses of a window's evaluated peers (``jobs``: uid → (update, sampled trained sequences)),
    at the model's θ_t, which holds θ_t again on return: this process (:func:`evaluate_peers`), or a node's ranks
    sharing the peers (neurons/validator_ranks.py)."""

    def __call__(self, model: Decoder, snapshot: ParameterSnapshot, codec: Any, hp: HParams, shared: SharedInputs,
                 jobs: Mapping[int, tuple[Any, torch.Tensor]]) -> dict[int, PeerLosses | Rejection]: ...


def evaluate_peers(model: Decoder, snapshot: ParameterSnapshot, codec: Any, hp: HParams, shared: SharedInputs,
                   jobs: Mapping[int, tuple[Any, torch.Tensor]]) -> dict[int, PeerLosses | Rejection]:
    """Every job's losses (or why its update cannot be evaluated), one peer after another, in place: one decoded
    update in memory at a time."""
    out: dict[int, PeerLosses | Rejection] = {}
    for uid, (update, trained) in jobs.items():
        step = update_step(codec, update, hp, shared.window, shared.reference, shared.shapes)
        out[uid] = step if isinstance(step, Rejection) else evaluate_peer(
            model, snapshot, step, shared.control, trained, shared.random, hp.micro_batch)
        del step
    return out
