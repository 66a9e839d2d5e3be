"""Primary evaluation of one peer's update, in place on the validator's model.

``θ'_p = θ_t − step_p`` (:func:`update_step`: the outer rule's step with the peer's update, scaled by
``eval_scale``; ``β_eval·sign(Δ_p)`` for the Gauntlet's signed rule) is applied to the live parameters, the losses
are measured, and θ_t is put back **bit-exactly** from one snapshot taken per
window (``p.copy_(snapshot)``; undoing with ``+ β·sign`` would not round-trip in
floating point, and the validator's model hash must keep matching the miners').
Memory: one parameter copy per window plus one decoded update at a time.

Cost per peer: three forward passes over ``eval_sequences`` sequences —
L(θ_t, D_p), L(θ', D_p), L(θ', D_rand) — while L(θ_t, D_rand) is measured once
per window and shared by all evaluated peers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

import torch

from dso.config import HParams
from dso.model import Decoder
from dso.outer import evaluation_step, peer_norms
from dso.rejections import Reason, Rejection
from dso.train import evaluate
from scoring.formulas import loss_delta


class ParameterSnapshot:
    """One exact copy of θ_t for a window; :meth:`restore` writes it back with ``copy_``."""

    def __init__(self, model: Decoder):
        self.params = [p for _, p in model.named_parameters()]
        self.copies = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def restore(self) -> None:
        for p, saved in zip(self.params, self.copies):
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
    """What the validator subtracts from θ_t to score one update: :func:`dso.outer.evaluation_step`, the
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
    """The four losses of one evaluation (``base_*`` at θ_t, ``stepped_*`` at θ'_p)."""

    base_assigned: float
    stepped_assigned: float
    base_rand: float
    stepped_rand: float

    @property
    def delta_assigned(self) -> float:
        return loss_delta(self.base_assigned, self.stepped_assigned)

    @property
    def delta_rand(self) -> float:
        """LossScore."""
        return loss_delta(self.base_rand, self.stepped_rand)


def evaluate_peer(model: Decoder, snapshot: ParameterSnapshot, signs: Mapping[str, torch.Tensor],
                  step: float, assigned: torch.Tensor, rand: torch.Tensor, base_rand: float,
                  micro_batch: int) -> PeerLosses:
    """Losses of θ_t and θ_t − step·signs on the peer's assigned data and on D_rand (``signs`` may be any
    displacement, e.g. :func:`update_step` with ``step`` 1).

    ``model`` must hold θ_t on entry; it holds θ_t again (bit for bit) on return,
    also when a forward pass raises."""
    device = snapshot.params[0].device
    base_assigned = evaluate(model, assigned, micro_batch, device)
    try:
        with torch.no_grad():
            for (name, p) in model.named_parameters():
                p.sub_(signs[name].to(device=p.device, dtype=p.dtype), alpha=step)
        stepped_assigned = evaluate(model, assigned, micro_batch, device)
        stepped_rand = evaluate(model, rand, micro_batch, device)
    finally:
        snapshot.restore()
    return PeerLosses(base_assigned, stepped_assigned, base_rand, stepped_rand)


class PeerEvaluator(Protocol):
    """Who computes the losses of the peers evaluated in a window (``jobs``: uid → (update, assigned
    sequences), evaluated at the model's θ_t, which must hold θ_t again on return): this process
    (:func:`evaluate_peers`), or a node's ranks sharing the peers (neurons/validator_ranks.py)."""

    def __call__(self, model: Decoder, codec: Any, hp: HParams, window: int, reference: Mapping[str, float],
                 shapes: Mapping[str, tuple[int, ...]], jobs: Mapping[int, tuple[Any, torch.Tensor]],
                 rand: torch.Tensor, base_rand: float) -> dict[int, PeerLosses | Rejection]: ...


def evaluate_peers(model: Decoder, codec: Any, hp: HParams, window: int, reference: Mapping[str, float],
                   shapes: Mapping[str, tuple[int, ...]], jobs: Mapping[int, tuple[Any, torch.Tensor]],
                   rand: torch.Tensor, base_rand: float) -> dict[int, PeerLosses | Rejection]:
    """Every job's losses (or why its update cannot be evaluated), one peer after another, in place."""
    snapshot = ParameterSnapshot(model)
    out: dict[int, PeerLosses | Rejection] = {}
    for uid, (update, assigned) in jobs.items():
        step = update_step(codec, update, hp, window, reference, shapes)
        out[uid] = step if isinstance(step, Rejection) else evaluate_peer(
            model, snapshot, step, 1.0, assigned, rand, base_rand, hp.micro_batch)
        del step
    return out
