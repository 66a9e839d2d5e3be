"""Signed aggregation (Gauntlet Algorithm 2) and the signed step.

Each selected peer's values are L2-normalised per parameter tensor in the DCT
domain (so a ×1000-scaled update counts the same as the unscaled one),
averaged over peers, decoded, and only the sign is applied:
``θ ← θ·(1 − α·wd) − α·sign(Δ)``.  Peers are processed in uid order so every
node computes the same bits.
"""
from __future__ import annotations

import torch

from dso.codec import CompressedUpdate, DeMoCodec


def normalised_values(codec: DeMoCodec, name: str, update: CompressedUpdate) -> torch.Tensor | None:
    """A peer's values for one tensor scaled to unit L2 norm; None when they carry no direction."""
    vals = codec.values(update[name])
    norm = torch.linalg.vector_norm(vals)
    if not torch.isfinite(norm) or norm == 0:
        return None
    return vals / norm


def mean_delta(codec: DeMoCodec, updates: list[CompressedUpdate], device="cpu") -> dict[str, torch.Tensor]:
    """Decoded mean of the L2-normalised updates (parameter space, not yet signed)."""
    out: dict[str, torch.Tensor] = {}
    for name, plan in codec.plans.items():
        acc = torch.zeros(plan.n_chunks, plan.chunk_size, device=device)
        for update in updates:
            vals = normalised_values(codec, name, update)
            if vals is not None:
                acc.scatter_add_(1, update[name].idx.to(device), vals.to(device))
        if updates:
            acc /= len(updates)
        out[name] = plan.decode(acc)
    return out


def signs(delta: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: torch.sign(d) for n, d in delta.items()}


@torch.no_grad()
def signed_step(model: torch.nn.Module, sign: dict[str, torch.Tensor], lr: float, weight_decay: float = 0.0,
                scale: float = 1.0) -> None:
    """θ ← θ·(1 − lr·wd) − scale·lr·sign, in place.  ``scale=-1`` undoes a step taken without decay."""
    for name, p in model.named_parameters():
        if weight_decay:
            p.mul_(1.0 - lr * weight_decay)
        p.sub_(sign[name].to(p.device), alpha=scale * lr)
