"""Differential privacy for a miner's updates (ZIP-400 §2, §7): clip + Gaussian noise, and a
Rényi-DP accountant that stops the miner before its ε budget is spent.

Mechanism.  Each round the miner's whole update (all tensors together) is clipped to L2 norm
``C`` and N(0, (z·C)²) noise is added to every coordinate.  The guarantee is for one miner against
every reader of its uploads, with "replace one" neighbours: the same miner on two different data
sets (for a round, or for the whole run).  Two clipped updates can differ by 2C, so one round is the
Gaussian mechanism with sensitivity 2C: RDP(α) = 2α / z² (dso/privacy/rdp.py has the formulas), no
subsampling.  Rounds compose by adding RDP per order.  RDP is converted to (ε, δ) with Balle et al.
2020.  ``dp.target_epsilon`` derives z from a target (ε, δ, rounds) instead (:func:`dp_settings`).

The miner applies :func:`clip_and_noise` to its gradient *before* error feedback and the codec,
so everything it ever sends is post-processing of privatised gradients (docs/extensions.md).
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import torch

from dso.privacy.rdp import REPLACE_ONE, gaussian_rdp, noise_for_target, rdp_to_epsilon
from dso.protocol.rejections import Reason, Rejection
from dso.util.atomic import atomic_write

if TYPE_CHECKING:
    from dso.codec.demo import Release
    from dso.config.schema import DPConfig

__all__ = ["REPLACE_ONE", "PrivacyStateError", "RdpAccountant", "clip_and_noise", "dp_settings", "gaussian_rdp",
           "global_norm", "noise_for_target", "rdp_to_epsilon"]
STATE_FORMAT = "dso-rdp-accountant/v2"
# v1 files recorded RDP with sensitivity C; Gaussian RDP scales with the squared sensitivity, so ×4 is exact
LEGACY_FORMATS = {"dso-rdp-accountant/v1": REPLACE_ONE ** 2}


class PrivacyStateError(ValueError):
    """The saved accountant state is missing fields, damaged or incompatible: never silently reset."""


# ------------------------------------------------------------- mechanism
def global_norm(tensors: dict[str, torch.Tensor]) -> float:
    """L2 norm over every value of every tensor (float64 accumulation)."""
    total = 0.0
    for t in tensors.values():
        total += float(torch.linalg.vector_norm(t.detach().to(torch.float64)) ** 2)
    return math.sqrt(total)


def clip_and_noise(tensors: dict[str, torch.Tensor], clip_norm: float, noise_multiplier: float,
                   generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Scale the whole update to L2 norm ≤ ``clip_norm``, then add N(0, (noise_multiplier·clip_norm)²)
    to every coordinate.  Noise is drawn from ``generator`` (CPU) in sorted tensor-name order, so the
    result is reproducible from the generator's seed.  Returns new float32 tensors (same keys)."""
    if not (clip_norm > 0 and math.isfinite(clip_norm)):
        raise ValueError(f"clip_norm must be a positive finite number, got {clip_norm}")
    if not (noise_multiplier >= 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be >= 0 and finite, got {noise_multiplier}")
    norm = global_norm(tensors)
    if not math.isfinite(norm):
        raise ValueError("update holds NaN or ±inf: it cannot be clipped, refusing to privatise it")
    factor = min(1.0, clip_norm / norm) if norm > 0 else 1.0
    std = noise_multiplier * clip_norm
    out: dict[str, torch.Tensor] = {}
    for name in sorted(tensors):
        t = tensors[name].detach().to(torch.float32) * factor
        if std > 0:
            noise = torch.randn(t.shape, generator=generator, dtype=torch.float32)
            t = t + noise.to(t.device) * std
        out[name] = t
    return {name: out[name] for name in tensors}


# ------------------------------------------------------------ accounting
def dp_settings(dp: DPConfig) -> tuple[float, float]:
    """(noise multiplier z, ε budget) of a :class:`dso.config.schema.DPConfig`: as given, or with
    ``target_epsilon > 0`` the z that spends exactly the target over ``target_rounds`` rounds, and the
    target as the budget (so a miner stops after those rounds)."""
    if dp.target_epsilon > 0:
        z = noise_for_target(dp.target_epsilon, dp.delta, dp.target_rounds, range(2, dp.max_order + 1))
        return z, float(dp.target_epsilon)
    return float(dp.noise_multiplier), float(dp.epsilon_budget)


class RdpAccountant:
    """Privacy spent so far, as RDP per order; ``rdp`` only ever grows."""

    def __init__(self, noise_multiplier: float, delta: float = 1e-6, orders: Iterable[float] = range(2, 128)):
        self.orders = [int(a) if float(a).is_integer() else float(a) for a in orders]
        if not self.orders or any(not (a > 1 and math.isfinite(a)) for a in self.orders):
            raise ValueError("Rényi orders must be finite numbers > 1")
        if len(set(self.orders)) != len(self.orders):
            raise ValueError("Rényi orders must be distinct")
        if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
            raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier}")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        self.noise_multiplier = float(noise_multiplier)
        self.delta = float(delta)
        self.rdp = [0.0] * len(self.orders)
        self.rounds = 0

    @classmethod
    def from_config(cls, dp: DPConfig) -> RdpAccountant:
        """From a :class:`dso.config.schema.DPConfig` (z from :func:`dp_settings`)."""
        return cls(dp_settings(dp)[0], dp.delta, range(2, dp.max_order + 1))

    def _after(self, rounds: int) -> list[float]:
        if rounds < 0:
            raise ValueError("rounds must be >= 0")
        per_round = gaussian_rdp(self.orders, self.noise_multiplier)
        return [r + rounds * p for r, p in zip(self.rdp, per_round, strict=True)]

    def step(self, rounds: int = 1) -> None:
        """Record ``rounds`` uploads made with the current noise multiplier."""
        self.rdp = self._after(rounds)
        self.rounds += rounds

    def epsilon(self) -> tuple[float, float | None]:
        """(ε spent so far at this δ, the order attaining it)."""
        return rdp_to_epsilon(self.rdp, self.orders, self.delta)

    def epsilon_after(self, rounds: int) -> tuple[float, float | None]:
        """(ε, order) if ``rounds`` more rounds were taken from now."""
        return rdp_to_epsilon(self._after(rounds), self.orders, self.delta)

    def would_exceed(self, budget: float) -> bool:
        """True when one more round would take ε above ``budget``."""
        return self.epsilon_after(1)[0] > budget

    def budget_rejection(self, budget: float) -> Rejection | None:
        """What a miner logs and reports instead of uploading once its budget is reached."""
        if not self.would_exceed(budget):
            return None
        spent, _ = self.epsilon()
        nxt, order = self.epsilon_after(1)
        return Rejection(Reason.DP_BUDGET, f"privacy budget ε={budget:g} reached: spent ε={spent:.4f} over "
                                           f"{self.rounds} rounds, one more would make ε={nxt:.4f} (order {order})")

    # ------------------------------------------------------- persistence
    def state(self) -> dict[str, Any]:
        return {"format": STATE_FORMAT, "noise_multiplier": self.noise_multiplier, "delta": self.delta,
                "orders": list(self.orders), "rdp": list(self.rdp), "rounds": self.rounds}

    def save(self, path: str | Path) -> None:
        """Atomic write (see :func:`dso.util.atomic.atomic_write`)."""
        atomic_write(path, json.dumps(self.state(), allow_nan=False).encode())

    @classmethod
    def load(cls, path: str | Path) -> RdpAccountant:
        """Strict inverse of :meth:`save`; raises :class:`PrivacyStateError` on anything unexpected,
        including a damaged file (absurd nesting, numbers too large for a double): never another error."""
        try:
            return cls._load(path)
        except PrivacyStateError:
            raise
        except (RecursionError, OverflowError, TypeError, ValueError) as exc:
            raise PrivacyStateError(f"privacy state {path} is damaged: {type(exc).__name__}: "
                                    f"{str(exc)[:120]}") from None

    @classmethod
    def _load(cls, path: str | Path) -> RdpAccountant:
        try:
            data = json.loads(Path(path).expanduser().read_text(), parse_constant=_reject_constant)
        except (OSError, ValueError) as exc:
            raise PrivacyStateError(f"cannot read privacy state {path}: {exc}") from exc
        want = {"format", "noise_multiplier", "delta", "orders", "rdp", "rounds"}
        if not isinstance(data, dict) or set(data) != want:
            raise PrivacyStateError(f"privacy state {path}: expected keys {sorted(want)}")
        if data["format"] != STATE_FORMAT and data["format"] not in LEGACY_FORMATS:
            raise PrivacyStateError(f"privacy state {path}: unknown format {data['format']!r}")
        numbers = (data["noise_multiplier"], data["delta"], *_list(data["orders"]), *_list(data["rdp"]))
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in numbers):
            raise PrivacyStateError(f"privacy state {path}: non-numeric field")
        rounds = data["rounds"]
        if not isinstance(rounds, int) or isinstance(rounds, bool) or not 0 <= rounds <= 2 ** 53:
            raise PrivacyStateError(f"privacy state {path}: rounds must be an integer in [0, 2**53]")
        if len(data["rdp"]) != len(data["orders"]) or any(not (r >= 0 and math.isfinite(r)) for r in data["rdp"]):
            raise PrivacyStateError(f"privacy state {path}: rdp must hold one finite value >= 0 per order")
        try:
            acc = cls(data["noise_multiplier"], data["delta"], data["orders"])
        except ValueError as exc:
            raise PrivacyStateError(f"privacy state {path}: {exc}") from exc
        scale = LEGACY_FORMATS.get(data["format"], 1.0)  # an older file under-counted: re-express it exactly
        acc.rdp = [float(r) * scale for r in data["rdp"]]
        acc.rounds = data["rounds"]
        return acc

    @classmethod
    def load_or_create(cls, path: str | Path, noise_multiplier: float, delta: float,
                       orders: Iterable[float]) -> RdpAccountant:
        """Resume the spending recorded at ``path`` (fresh only if the file does not exist).

        Future rounds use the given noise multiplier and δ; the saved orders must match, since
        RDP spent at one set of orders cannot be re-expressed at another."""
        orders = list(orders)
        if not Path(path).expanduser().exists():
            return cls(noise_multiplier, delta, orders)
        acc = cls.load(path)
        if acc.orders != [int(a) if float(a).is_integer() else float(a) for a in orders]:
            raise PrivacyStateError(f"privacy state {path}: saved Rényi orders differ from the configured ones")
        fresh = cls(noise_multiplier, delta, orders)  # validates the new settings
        acc.noise_multiplier, acc.delta = fresh.noise_multiplier, fresh.delta
        return acc


def noisy_release(clip_norm: float, noise_multiplier: float, generator: torch.Generator,
                  accountant: RdpAccountant | None = None) -> Release:
    """What a peer may send of its pseudo-gradient: :func:`clip_and_noise` of it, the round counted on
    ``accountant`` (the simulator's peers; a miner also saves the count first: neurons/miner_privacy.py)."""

    def release(grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = clip_and_noise(grads, clip_norm, noise_multiplier, generator)
        if accountant is not None:
            accountant.step()
        return out
    return release


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise PrivacyStateError("privacy state: orders and rdp must be lists")
    return value


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"non-finite number {name} in privacy state")
