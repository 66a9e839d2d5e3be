"""Synthetic Byzantine rows against an honest matrix, for tests and benchmarks of the robust rules.

Each attack is crafted with full knowledge of the honest rows (the strongest adversary the rules in
dso/aggregation/robust.py are measured against).
"""
from __future__ import annotations

import math

import torch

ATTACKS = ("sign_flip", "scaling", "ipm", "alie", "infinite")


def alie_z(n: int, f: int) -> float:
    """z of 'A Little Is Enough' (Baruch et al. 2019): s = ⌊n/2 + 1⌋ − f, z = Φ⁻¹((n − s)/n)."""
    s = math.floor(n / 2 + 1) - f
    p = torch.tensor((n - s) / n, dtype=torch.float64)
    return float(torch.erfinv(2 * p - 1) * math.sqrt(2))  # the standard normal's icdf, as torch's Normal has it


def byzantine_rows(honest: torch.Tensor, attack: str, f: int, generator: torch.Generator,
                   scale: float = 100.0, ipm_epsilon: float = 0.1) -> torch.Tensor:
    """f Byzantine rows crafted against the honest matrix (for tests and benchmarks).

    sign_flip: −x_i of honest rows; scaling: ``scale`` × a random direction of honest norm;
    ipm: −ε·mean; alie: mean − z·std (coordinate-wise); infinite: +inf everywhere."""
    n, d = honest.shape[0] + f, honest.shape[1]
    mu, sigma = honest.mean(dim=0), honest.std(dim=0)
    if attack == "sign_flip":
        return -honest[torch.arange(f) % honest.shape[0]]
    if attack == "scaling":
        noise = torch.randn(f, d, generator=generator, dtype=honest.dtype)
        norm: torch.Tensor = torch.linalg.vector_norm(honest, dim=1).mean()
        noise_norms: torch.Tensor = torch.linalg.vector_norm(noise, dim=1, keepdim=True)
        return scale * noise / noise_norms * norm
    if attack == "ipm":
        return (-ipm_epsilon * mu).expand(f, d).clone()
    if attack == "alie":
        return (mu - alie_z(n, f) * sigma).expand(f, d).clone()
    if attack == "infinite":
        return torch.full((f, d), math.inf, dtype=honest.dtype)
    raise ValueError(f"unknown attack {attack!r}; choose one of {', '.join(ATTACKS)}")
