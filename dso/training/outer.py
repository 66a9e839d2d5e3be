"""The network's outer step: the selected peers' compressed updates → θ_{t+1} (docs/training.md).

The rule (``hparams.outer.rule``) is a strategy object, :func:`dso.training.outer_rules.outer_rule`: ``signed`` (the
Gauntlet's: Δ = decoded mean of per-tensor L2-normalised updates, ``θ ← θ·(1 − α·wd) − α·sign(Δ)``), ``sgd``
(``θ ← θ − lr·Δ``) or ``nesterov`` (``m ← μ·m + Δ; θ ← θ − lr·(Δ + μ·m)``).

For ``sgd`` and ``nesterov`` Δ keeps a magnitude: every peer is still normalised per tensor (so a
×1000-scaled update counts once), and the mean is rescaled per tensor by the **median** norm of
the selected peers (the reference norm): no single peer sets the step size, and with honest
peers Δ has the size of a typical pseudo-gradient.

Bit-identity: for the default aggregation (plain mean, no coherence gate) the mean is built in
float64 by elementwise adds in the callers' (uid) order, norms are exactly rounded and the
inverse DCT is exact (dso/training/exact.py), and the update uses separate float32 operations — so every
node computes the same θ_{t+1} and momentum on any CPU.  The robust rules reuse dso/aggregation/robust.py.

:func:`evaluation_step` is what a validator subtracts from θ_t to score one peer's update the way
the network would apply it.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dso.aggregation.robust import AggregationInfo, robust_delta
from dso.config.schema import HParams
from dso.nn.model import state_hash
from dso.training.exact import exact_decode, exact_norm
from dso.training.outer_rules import OuterRule, outer_rule

STATE_PREFIX = "outer."


# ------------------------------------------------------------------ state
@dataclass
class OuterState:
    """The outer optimiser's state: part of every checkpoint, replayed by catch-up."""

    momentum: dict[str, torch.Tensor] = field(default_factory=dict)  # float32, nesterov only
    steps: int = 0

    @classmethod
    def fresh(cls, shapes: Mapping[str, tuple[int, ...]], rule: HParams | OuterRule) -> OuterState:
        """The state at the start of a run of ``rule`` (the run's, for ``HParams``)."""
        return cls.zeros(shapes, _rule(rule).keeps_momentum)

    @classmethod
    def zeros(cls, shapes: Mapping[str, tuple[int, ...]], momentum: bool) -> OuterState:
        """A fresh state with (``momentum``) or without a zero momentum tensor per parameter."""
        return cls({n: torch.zeros(s, dtype=torch.float32) for n, s in shapes.items()} if momentum else {})

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {f"{STATE_PREFIX}steps": torch.tensor([self.steps], dtype=torch.int64)}
        out.update({f"{STATE_PREFIX}momentum.{n}": m.detach().cpu().contiguous() for n, m in self.momentum.items()})
        return out

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, torch.Tensor], shapes: Mapping[str, tuple[int, ...]],
                     rule: HParams | OuterRule | None) -> OuterState | None:
        """Strict inverse of :meth:`tensors` for this run's rule (``rule``, or the run's for ``HParams``; None:
        whichever state the tensors hold) and model; None on any mismatch."""
        keeps = (any(k.startswith(f"{STATE_PREFIX}momentum.") for k in tensors) if rule is None
                 else _rule(rule).keeps_momentum)
        steps = tensors.get(f"{STATE_PREFIX}steps")
        if steps is None or steps.dtype != torch.int64 or tuple(steps.shape) != (1,) or int(steps[0]) < 0:
            return None
        names = list(shapes) if keeps else []
        if set(tensors) != {f"{STATE_PREFIX}steps"} | {f"{STATE_PREFIX}momentum.{n}" for n in names}:
            return None
        momentum = {}
        for n in names:
            m = tensors[f"{STATE_PREFIX}momentum.{n}"]
            if m.dtype != torch.float32 or tuple(m.shape) != tuple(shapes[n]) or not bool(torch.isfinite(m).all()):
                return None
            momentum[n] = m.clone()
        return cls(momentum, int(steps[0]))

    def digest(self) -> str:
        return state_hash(sorted(self.tensors().items()))

    def spec(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """numpy dtype name and shape of every tensor of :meth:`tensors` (for strict file checks)."""
        return {k: (str(t.numpy().dtype), tuple(t.shape)) for k, t in self.tensors().items()}


def _rule(rule: HParams | OuterRule) -> OuterRule:
    return rule if isinstance(rule, OuterRule) else outer_rule(rule)


# -------------------------------------------------------------- aggregate
class StreamedDelta(Mapping[str, torch.Tensor]):
    """Δ one tensor at a time: each tensor is decoded when it is read and not kept, so a step that reads Δ tensor
    by tensor (:func:`apply_outer`, a sliced θ's step) holds one decoded tensor, never the whole Δ (4 B/param).
    ``dict(delta)`` decodes all of it; :meth:`keep` keeps what is decoded for a caller that reads Δ again."""

    def __init__(self, names: Sequence[str], decode: Callable[[str], torch.Tensor]):
        self.names = list(names)
        self._known = set(self.names)
        self._decode = decode
        self._kept: dict[str, torch.Tensor] | None = None

    def keep(self) -> dict[str, torch.Tensor]:
        """From now on keep every tensor decoded (read again from there): the dict they go in."""
        if self._kept is None:
            self._kept = {}
        return self._kept

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._known:
            raise KeyError(name)
        if self._kept is not None and name in self._kept:
            return self._kept[name]
        tensor = self._decode(name)
        if self._kept is not None:
            self._kept[name] = tensor
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


@dataclass
class Aggregate:
    """One window's aggregate: Δ per parameter (signs for the signed rule), decoded as it is read, and how it was
    made."""

    delta: StreamedDelta
    reference_norms: dict[str, float]
    info: AggregationInfo


def median(values: Sequence[float]) -> float:
    """Median (mean of the two middle values for an even count); 0 for no values."""
    v = sorted(values)
    if not v:
        return 0.0
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def peer_norms(codec: Any, update: Any) -> dict[str, float]:  # a DeMo or sketch codec and its update
    """‖values‖ per tensor of one compressed update (codec domain, exactly rounded)."""
    return {n: exact_norm(codec.values(update[n])) for n in codec.shapes}


def reference_norms(norms: Sequence[Mapping[str, float]], names: Sequence[str]) -> dict[str, float]:
    """Per tensor, the median norm over peers whose norm is finite and non-zero."""
    return {n: median([p[n] for p in norms if math.isfinite(p[n]) and p[n] > 0]) for n in names}


def _exact_mean(codec: Any, updates: list[Any], norms: list[dict[str, float]], name: str, scale: float) -> torch.Tensor:
    """scale · mean over peers of values/‖values‖ in the codec domain, float64, in the given order."""
    plan = codec.plans[name]
    acc = torch.zeros(plan.n_chunks, plan.chunk_size, dtype=torch.float64)
    for update, norm in zip(updates, norms, strict=True):
        if math.isfinite(norm[name]) and norm[name] > 0:
            u = update[name]
            acc.scatter_add_(1, u.idx, codec.values(u).double() / norm[name])  # unique indices per row
    if not updates:
        return acc
    return acc * (scale / len(updates))


def exact_path(codec: Any, hp: HParams) -> bool:
    """The machine-independent path: DeMo-style codec, plain mean, no coherence gate."""
    return hasattr(codec, "plans") and hp.aggregation == "mean" and hp.coherence_threshold <= -1


def aggregate(codec: Any, updates: list[Any], hp: HParams, ids: Sequence[int] | None = None) -> Aggregate:
    """The aggregate of the selected peers' updates (callers pass them in uid order) under the run's
    outer rule; Δ is zero without updates.

    Δ is streamed (:class:`StreamedDelta`): on the exact path each tensor is the mean of the peers' normalised
    values for that tensor, decoded, rescaled and finished when it is read — no rule needs anything across
    tensors (the reference norm is per tensor, from the compressed values).  The robust path's rules do
    (rows dropped when not finite anywhere, Multi-Krum's and the geometric median's distances over whole rows,
    the coherence gate's cosines): it computes Δ whole from the peers' decoded rows first, then hands it out
    tensor by tensor."""
    ids = list(range(len(updates))) if ids is None else list(ids)
    norms = [peer_norms(codec, u) for u in updates]
    names = list(codec.shapes)
    refs = reference_norms(norms, names)
    rule = outer_rule(hp)
    if exact_path(codec, hp):
        def decode(name: str) -> torch.Tensor:
            mean = _exact_mean(codec, updates, norms, name, rule.mean_scale(refs[name]))
            return rule.finish(exact_decode(codec.plans[name], mean))
        return Aggregate(StreamedDelta(names, decode), refs, AggregationInfo("mean", kept=ids, selected=ids))
    whole, info = robust_delta(codec, updates, hp, ids)
    return Aggregate(StreamedDelta(names, lambda name: rule.finish(rule.rescale(whole[name], refs[name]))), refs,
                     info)


# ------------------------------------------------------------------ step
def outer_lr(hp: HParams, window: int) -> float:
    """α_t (with warm-up) for the signed rule; the constant outer lr for the optimiser rules."""
    return outer_rule(hp).lr(window)


@torch.no_grad()
def apply_outer(params: Mapping[str, torch.Tensor], delta: Mapping[str, torch.Tensor], state: OuterState,
                hp: HParams, window: int) -> float:
    """θ_{t+1} in place on ``params`` (name → tensor, e.g. ``dict(model.named_parameters())``) and the
    outer state; returns the mean |θ_{t+1} − θ_t| per parameter (SyncScore's unit for the optimiser
    rules; exactly α for the signed one without weight decay).

    One elementwise float32 operation at a time (no fused multiply-add): the same bits everywhere.  Δ is read
    one tensor at a time, in ``params``' order, and that tensor is freed before the next is read: with a
    :class:`StreamedDelta` the whole Δ never exists."""
    rule = outer_rule(hp)
    lr = rule.lr(window)
    moved, count = 0.0, 0
    for name, p in params.items():
        d = rule.direction(name, delta[name].to(device=p.device, dtype=torch.float32), state.momentum)
        moved += outer_step_tensor(p, d, rule, lr)
        count += p.numel()
        del d  # before the next tensor is decoded
    state.steps += 1
    return moved / max(count, 1)


@torch.no_grad()
def outer_step_tensor(param: torch.Tensor, direction: torch.Tensor, rule: OuterRule, lr: float) -> float:
    """One tensor of :func:`apply_outer` in place (the rule's decay, then ``param − lr·direction``); elementwise,
    so a slice of the tensor steps exactly as the whole one does (dso/distributed/sliced_theta.py).  Returns
    Σ |moved| over its elements."""
    lr32 = torch.tensor(lr, dtype=torch.float32, device=param.device)
    before = param.detach().clone()
    rule.decay(param, lr)
    param.copy_(torch.sub(param, torch.mul(direction, lr32)))
    return float(torch.sub(param, before).abs().double().sum())


# ------------------------------------------------------------ evaluation
def evaluation_step(hp: HParams, window: int, decoded: Mapping[str, torch.Tensor], norms: Mapping[str, float],
                    reference: Mapping[str, float]) -> dict[str, torch.Tensor]:
    """What a validator subtracts from θ_t to score one peer (``θ'_p = θ_t − step``), c = eval_scale:

    * signed: ``c·α_t·sign(Δ_p)`` (the paper's evaluation);
    * sgd / nesterov: ``c·lr_eff·Δ_p·(ref/‖Δ_p‖)`` per tensor, lr_eff = lr (sgd) or lr·(1+μ)
      (nesterov: the weight of this window's Δ in θ_{t+1}), ``‖Δ_p‖`` the peer's codec-domain norm
      (``norms``) and ``ref`` the window's reference norm — the step the aggregate would take if
      every selected peer had sent Δ_p.  A tensor with a zero or non-finite norm does not move.

    ``decoded`` is the peer's decoded update (codec ``decompress``), already checked finite."""
    return outer_rule(hp).evaluation_step(window, decoded, norms, reference)


def peer_evaluation_step(codec: Any, update: Any, hp: HParams, window: int,
                         reference: Mapping[str, float]) -> dict[str, torch.Tensor]:
    """:func:`evaluation_step` of one compressed update (decoded with the codec's float path)."""
    return evaluation_step(hp, window, codec.decompress(update), peer_norms(codec, update), reference)
