"""Signed aggregation (Gauntlet Algorithm 2) and the signed step.

Each selected peer's values are L2-normalised per parameter tensor in the codec
domain (so a ×1000-scaled update counts the same as the unscaled one),
averaged over peers, decoded, and only the sign is applied:
``θ ← θ·(1 − α·wd) − α·sign(Δ)``.  Callers pass peers in uid order so every
node computes the same bits.
"""
from __future__ import annotations

import torch

from dso.aggregation.robust import AggregationInfo, robust_delta
from dso.codec.codecs import Codec, Update
from dso.config.schema import HParams


def aggregate_signs(codec: Codec, updates: list[Update], hp: HParams, ids: list[int] | None = None,
                    device: str | torch.device = "cpu") -> tuple[dict[str, torch.Tensor], AggregationInfo]:
    """sign(Δ) per parameter under the run's rule (``hp.aggregation``, coherence gate); Δ = 0 without updates.

    The Gauntlet rule is the decoded mean of L2-normalised updates; the robust rules run on the
    per-peer decoded updates (dso.aggregation.robust)."""
    delta, info = robust_delta(codec, updates, hp, ids, device)
    return {n: torch.sign(d) for n, d in delta.items()}, info


@torch.no_grad()
def signed_step(model: torch.nn.Module, sign: dict[str, torch.Tensor], lr: float, weight_decay: float = 0.0) -> None:
    """θ ← θ·(1 − lr·wd) − lr·sign, in place."""
    for name, p in model.named_parameters():
        if weight_decay:
            p.mul_(1.0 - lr * weight_decay)
        p.sub_(sign[name].to(p.device), alpha=lr)
