"""Chunked orthonormal DCT-II / DCT-III by precomputed basis matrices.

A parameter is viewed as 1-D or 2-D (higher ranks are flattened to
``(shape[0], rest)``) and cut into chunks whose edge is the largest divisor of
the dimension that is ``<= target``.  A dimension with no good divisor (the
best one is under half the target — e.g. a prime vocabulary size) is zero
padded up to a multiple of ``target`` instead, so it still compresses; the
padding is cropped on decode and error feedback keeps what falls into it.
With ``transform=False`` the chunks are only cut, not transformed: top-k then
runs in the raw parameter domain (Templar's current codec).  See ``docs/codec.md``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import torch


@cache
def _basis_cpu(n: int) -> torch.Tensor:
    k = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(n, dtype=torch.float64)[None, :]
    basis = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    basis[0] /= math.sqrt(2.0)
    return basis.to(torch.float32)


_DEVICE_CACHE: dict[tuple[int, str], torch.Tensor] = {}


def dct_basis(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Orthonormal DCT-II matrix D (n×n): ``D @ x`` is the DCT of x, ``D.T @ y`` its inverse (DCT-III)."""
    key = (n, str(device))
    if key not in _DEVICE_CACHE:
        _DEVICE_CACHE[key] = _basis_cpu(n).to(device)
    return _DEVICE_CACHE[key]


def choose_edge(dim: int, target: int) -> tuple[int, int]:
    """(chunk edge, padded length) for one dimension."""
    if dim <= target:
        return dim, dim
    best = max(d for d in range(1, target + 1) if dim % d == 0)
    if 2 * best >= target:
        return best, dim
    return target, -(-dim // target) * target


@dataclass(frozen=True)
class ChunkPlan:
    """How one parameter is cut into DCT chunks."""

    shape: tuple[int, ...]
    view: tuple[int, ...]    # the 1-D or 2-D view of the parameter
    padded: tuple[int, ...]
    edges: tuple[int, ...]
    transform: bool = True   # False: chunks of raw values (no DCT)

    @classmethod
    def for_shape(cls, shape: tuple[int, ...], target: int, transform: bool = True) -> ChunkPlan:
        numel = math.prod(shape)
        view = (numel,) if len(shape) <= 1 else (shape[0], numel // shape[0])
        pairs = [choose_edge(d, target) for d in view]
        return cls(tuple(shape), view, tuple(p for _, p in pairs), tuple(e for e, _ in pairs), transform)

    @property
    def grid(self) -> tuple[int, ...]:
        return tuple(p // e for p, e in zip(self.padded, self.edges, strict=True))

    @property
    def n_chunks(self) -> int:
        return math.prod(self.grid)

    @property
    def chunk_size(self) -> int:
        return math.prod(self.edges)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Tensor of ``shape`` → DCT coefficients, one row per chunk: (n_chunks, chunk_size)."""
        x = x.reshape(self.view)
        if self.padded != self.view:
            pad = [0, 0] * len(self.view)
            for axis, (p, v) in enumerate(zip(self.padded, self.view, strict=True)):
                pad[2 * (len(self.view) - 1 - axis) + 1] = p - v
            x = torch.nn.functional.pad(x, pad)
        if len(self.view) == 1:
            rows = x.reshape(self.grid[0], self.edges[0])
            return rows @ dct_basis(self.edges[0], x.device).T if self.transform else rows.clone()
        (gm, gn), (a, b) = self.grid, self.edges
        blocks = x.reshape(gm, a, gn, b).permute(0, 2, 1, 3)  # (gm, gn, a, b)
        if self.transform:
            blocks = dct_basis(a, x.device) @ blocks @ dct_basis(b, x.device).T
        return blocks.reshape(gm * gn, a * b)

    def decode(self, coeffs: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`encode` (crops any padding)."""
        if len(self.view) == 1:
            x = coeffs @ dct_basis(self.edges[0], coeffs.device) if self.transform else coeffs
            return x.reshape(self.padded)[: self.view[0]].reshape(self.shape)
        (gm, gn), (a, b) = self.grid, self.edges
        blocks = coeffs.reshape(gm, gn, a, b)
        if self.transform:
            blocks = dct_basis(a, coeffs.device).T @ blocks @ dct_basis(b, coeffs.device)
        x = blocks.permute(0, 2, 1, 3).reshape(self.padded)[: self.view[0], : self.view[1]]
        return x.reshape(self.shape)
