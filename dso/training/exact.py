"""Machine-independent arithmetic for the consensus path (aggregate → θ_{t+1}).

Every honest node must compute the same bits of θ_{t+1}.  Elementwise IEEE operations (+, −, ×, ÷,
√) are correctly rounded, so they agree everywhere as long as each is a separate operation (no
fused multiply-add).  Reductions are the problem: a BLAS matrix product or a vectorised sum adds in
an order that depends on the CPU and the library, and float rounding makes the order visible.

* :func:`exact_norm` — the L2 norm with an exactly rounded sum (``math.fsum`` of the float64
  squares of float32 values, which are exact).
* :func:`exact_decode` — the inverse chunked DCT in fixed point: coefficients are rounded to 24
  bits relative to the tensor's largest one (a power-of-two scale), the DCT basis to 2^-20, and the
  two separable passes are float64 matrix products whose every product and partial sum is an
  integer below 2^53 — exact, hence the same in any summation order, with or without FMA.  The
  first pass is rounded back to 24 bits before the second.  Precision: about 2^-24 of the
  tensor's largest coefficient (float32-like for the large values the update is made of).
"""
from __future__ import annotations

import math
from functools import cache

import numpy as np
import torch

from dso.codec.dct import ChunkPlan

COEFF_BITS = 23   # coefficients: |c| < 2^23 units after scaling
BASIS_BITS = 20   # basis: multiples of 2^-20
MAX_EDGE = 512    # sqrt(edge²)·2^43 < 2^53 keeps every partial sum exact


def exact_norm(values: torch.Tensor) -> float:
    """‖values‖₂ with the sum of squares exactly rounded (machine independent)."""
    squares = values.detach().cpu().double().reshape(-1).square().numpy()  # float32² is exact in float64
    return math.sqrt(math.fsum(squares.tolist()))


@cache
def fixed_basis(n: int) -> torch.Tensor:
    """Orthonormal DCT-II basis rounded to multiples of 2^-BASIS_BITS, as float64 integers.

    Computed from Python's ``math.cos``; :func:`basis_margin` shows that no entry lies near a
    rounding boundary, so a last-bit difference of another libm cannot change an integer."""
    return torch.from_numpy(np.rint(_basis_values(n) * 2.0 ** BASIS_BITS))


def _basis_values(n: int) -> np.ndarray:
    rows = [[math.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt((1.0 if k else 0.5) * 2.0 / n)
             for i in range(n)] for k in range(n)]
    return np.array(rows, dtype=np.float64)


def basis_margin(n: int) -> float:
    """Smallest distance (in units of 2^-BASIS_BITS) of a scaled basis entry to a rounding boundary."""
    scaled = _basis_values(n) * 2.0 ** BASIS_BITS
    return float(np.abs(np.abs(scaled - np.floor(scaled)) - 0.5).min())


def _scale_exponent(coeffs: torch.Tensor) -> int | None:
    """e such that max|c| < 2^e (None for an all-zero tensor)."""
    top = float(coeffs.abs().max()) if coeffs.numel() else 0.0
    if top == 0.0:
        return None
    return math.frexp(top)[1]  # top = m·2^e, 0.5 <= m < 1


def exact_decode(plan: ChunkPlan, coeffs: torch.Tensor) -> torch.Tensor:
    """Float32 parameter-shaped decode of (n_chunks, chunk_size) float64 coefficients, bit-identical
    on every machine.  Without the DCT (``plan.transform`` false) it is a plain float32 rounding."""
    coeffs = coeffs.detach().cpu().double()
    if not plan.transform:
        return _crop(plan, coeffs.float())
    if max(plan.edges) > MAX_EDGE:
        raise ValueError(f"exact decode supports chunk edges up to {MAX_EDGE}, got {max(plan.edges)}")
    e = _scale_exponent(coeffs)
    if e is None:
        return torch.zeros(plan.shape, dtype=torch.float32)
    # c = units·2^(e-23), basis = ints·2^-20; multiplying by a power of two is exact
    units = torch.round(coeffs * math.ldexp(1.0, COEFF_BITS - e))                 # |units| <= 2^23
    if len(plan.view) == 1:
        x = units @ fixed_basis(plan.edges[0])                                     # |partial| <= sqrt(n)·2^43
    else:
        (gm, gn), (a, b) = plan.grid, plan.edges
        rows = fixed_basis(a).T @ units.reshape(gm, gn, a, b)                      # |partial| <= sqrt(a)·2^43
        rows = torch.round(rows * math.ldexp(1.0, -BASIS_BITS))                    # back to c's units
        x = (rows @ fixed_basis(b)).permute(0, 2, 1, 3)                           # |partial| <= sqrt(ab)·2^43
    return _crop(plan, (x * math.ldexp(1.0, e - COEFF_BITS - BASIS_BITS)).float())


def _crop(plan: ChunkPlan, x: torch.Tensor) -> torch.Tensor:
    if len(plan.view) == 1:
        return x.reshape(plan.padded)[: plan.view[0]].reshape(plan.shape).contiguous()
    if x.dim() == 2:  # untransformed (n_chunks, chunk_size)
        (gm, gn), (a, b) = plan.grid, plan.edges
        x = x.reshape(gm, gn, a, b).permute(0, 2, 1, 3)
    x = x.reshape(plan.padded)[: plan.view[0], : plan.view[1]]
    return x.reshape(plan.shape).contiguous()
