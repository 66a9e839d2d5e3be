"""Signed aggregation (Gauntlet Algorithm 2) and the signed step.

Each selected peer's values are L2-normalised per parameter tensor in the codec
domain (so a ×1000-scaled update counts the same as the unscaled one),
averaged over peers, decoded, and only the sign is applied:
``θ ← θ·(1 − α·wd) − α·sign(Δ)``.  Callers pass peers in uid order so every
node computes the same bits.
"""
from __future__ import annotations

import torch


def aggregate_signs(codec, updates: list, device="cpu") -> dict[str, torch.Tensor]:
    """sign(decode(mean of normalised updates)) per parameter; all zeros when there are no updates."""
    return {n: torch.sign(d) for n, d in codec.mean_delta(updates, device).items()}


@torch.no_grad()
def signed_step(model: torch.nn.Module, sign: dict[str, torch.Tensor], lr: float, weight_decay: float = 0.0) -> None:
    """θ ← θ·(1 − lr·wd) − lr·sign, in place."""
    for name, p in model.named_parameters():
        if weight_decay:
            p.mul_(1.0 - lr * weight_decay)
        p.sub_(sign[name].to(p.device), alpha=lr)
