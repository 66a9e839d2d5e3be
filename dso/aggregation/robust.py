"""Byzantine-robust aggregation rules on per-peer decoded updates (ZIP-400 §3, design §7).

Every rule takes a stacked matrix ``X`` (n_peers × D, float32/float64 torch) and
returns one aggregate vector of length D; the caller signs it.  Rows that are not
entirely finite are dropped *before* any rule runs and reported as
:class:`~dso.protocol.rejections.Rejection` (``NON_FINITE``).  The optional coherence gate
(ZIP-001) drops rows whose cosine to a consensus direction is below a threshold.

* ``mean``          — plain mean (the Gauntlet default; no robustness).
* ``krum``          — Multi-Krum (Blanchard et al. 2017): score_i = sum of squared
  distances to the n−f−2 nearest *other* rows; plain mean of the m lowest scores.
* ``median``        — coordinate-wise median (mean of the two middle values for even n).
* ``trimmed_mean``  — coordinate-wise, ⌊βn⌋ values cut from each side.
* ``geomedian``     — geometric median by smoothed Weiszfeld iterations from the mean.

D can be millions, so pairwise distances come from one float64 Gram matrix
(n×n) built in column blocks, and Weiszfeld runs in the n-dimensional space of
mixing weights over that Gram matrix; sorts run block by block.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dso.protocol.rejections import Reason, Rejection

if TYPE_CHECKING:
    from dso.codec.codecs import Codec, Update
    from dso.config.schema import HParams

RULES = ("mean", "krum", "median", "trimmed_mean", "geomedian")
COLUMN_BLOCK = 1 << 18  # columns per block: bounds temporaries of sorts and Gram products


@dataclass
class AggregationInfo:
    """Which peers a rule used; ids are the caller's (uids) or row numbers."""

    rule: str
    kept: list[int] = field(default_factory=list)        # finite and coherent: entered the rule
    dropped: dict[int, Rejection] = field(default_factory=dict)  # non-finite rows
    incoherent: dict[int, float] = field(default_factory=dict)   # gate: id -> cosine to consensus
    selected: list[int] = field(default_factory=list)    # rows the rule averaged (Multi-Krum); else kept
    iterations: int = 0                                   # Weiszfeld iterations
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "kept": list(self.kept),
                "dropped": {str(k): str(v) for k, v in self.dropped.items()},
                "incoherent": {str(k): v for k, v in self.incoherent.items()},
                "selected": list(self.selected), "iterations": self.iterations, "notes": list(self.notes)}


# ----------------------------------------------------------------- helpers
def _check_matrix(X: torch.Tensor) -> None:
    if X.dim() != 2 or X.shape[0] == 0:
        raise ValueError(f"expected a non-empty (n_peers, D) matrix, got shape {tuple(X.shape)}")


def _columnwise(X: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Apply a per-column reduction block by block (keeps sort temporaries small)."""
    out = torch.empty(X.shape[1], dtype=X.dtype, device=X.device)
    for s in range(0, X.shape[1], COLUMN_BLOCK):
        out[s:s + COLUMN_BLOCK] = fn(X[:, s:s + COLUMN_BLOCK])
    return out


def _sorted_columns(block: torch.Tensor) -> torch.Tensor:
    """Each column sorted (exact, so every backend gives the same values); NumPy is ~5× faster on CPU."""
    if block.device.type == "cpu":
        return torch.from_numpy(np.sort(block.detach().numpy(), axis=0))
    return block.sort(dim=0).values


def _weighted_rows(X: torch.Tensor, weights: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """Σ_i w_i X_i accumulated in float64 in row order (same bits on every node)."""
    acc = torch.zeros(X.shape[1], dtype=torch.float64, device=X.device)
    for i, w in enumerate(weights):
        w = float(w)
        if w:
            acc.add_(X[i].to(torch.float64), alpha=w)
    return acc.to(X.dtype)


def gram(X: torch.Tensor) -> torch.Tensor:
    """X Xᵀ in float64 (float32 products are exact in float64), built in column blocks."""
    G = torch.zeros(X.shape[0], X.shape[0], dtype=torch.float64, device=X.device)
    for s in range(0, X.shape[1], COLUMN_BLOCK):
        block = X[:, s:s + COLUMN_BLOCK].to(torch.float64)
        G += block @ block.T
    return G


def pairwise_sq_distances(G: torch.Tensor) -> torch.Tensor:
    """‖x_i − x_j‖² from a Gram matrix; rounding can make tiny values negative, so clamp at 0."""
    sq = G.diagonal()
    d2 = (sq[:, None] + sq[None, :] - 2.0 * G).clamp_min(0.0)
    d2.fill_diagonal_(0.0)
    return d2


def finite_rows(X: torch.Tensor) -> torch.Tensor:
    """Bool mask (n,): rows whose every entry is finite."""
    _check_matrix(X)
    return torch.isfinite(X).all(dim=1)


def drop_non_finite(X: torch.Tensor, ids: Sequence[int] | None = None
                    ) -> tuple[torch.Tensor, list[int], dict[int, Rejection]]:
    """(finite rows, their ids, {id: Rejection(NON_FINITE)} for the rows removed)."""
    ids = list(range(X.shape[0])) if ids is None else list(ids)
    if len(ids) != X.shape[0]:
        raise ValueError(f"{len(ids)} ids for {X.shape[0]} rows")
    mask = finite_rows(X)
    kept = [i for i, ok in zip(ids, mask.tolist(), strict=True) if ok]
    dropped = {i: Rejection(Reason.NON_FINITE, "decoded update holds NaN or ±inf")
               for i, ok in zip(ids, mask.tolist(), strict=True) if not ok}
    return (X if not dropped else X[mask]), kept, dropped  # no copy of a model-sized matrix when all finite


def cosines_to(X: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """cos(x_i, direction) per row in float64; 0 for a zero row or a zero direction."""
    d = direction.to(torch.float64)
    dots = torch.stack([X[i].to(torch.float64) @ d for i in range(X.shape[0])])
    norms = torch.stack([torch.linalg.vector_norm(X[i].to(torch.float64)) for i in range(X.shape[0])])
    denom = norms * torch.linalg.vector_norm(d)
    return torch.where(denom > 0, dots / denom.clamp_min(1e-300), torch.zeros_like(dots))


def coherence_filter(X: torch.Tensor, consensus: torch.Tensor, threshold: float) -> torch.Tensor:
    """Bool mask: rows whose cosine to ``consensus`` is >= ``threshold`` (ZIP-001 coherence gate).

    ``threshold <= -1`` disables the gate; a zero consensus carries no direction, so it keeps every row."""
    _check_matrix(X)
    if threshold <= -1 or not bool(torch.linalg.vector_norm(consensus.to(torch.float64)) > 0):
        return torch.ones(X.shape[0], dtype=torch.bool, device=X.device)
    return cosines_to(X, consensus) >= threshold


# ------------------------------------------------------------------- rules
def mean(X: torch.Tensor) -> torch.Tensor:
    _check_matrix(X)
    return _weighted_rows(X, [1.0 / X.shape[0]] * X.shape[0])


def multi_krum(X: torch.Tensor, f: int, m: int = 0) -> tuple[torch.Tensor, list[int]]:
    """Multi-Krum: (plain mean of the m best-scored rows, their row numbers ascending).

    ``m = 0`` means n − f.  Scores use the n−f−2 nearest other rows (at least 1, at most n−1);
    the guarantee of Blanchard et al. needs n ≥ 2f + 3.  Ties go to the lower row number.
    Self-reported sizes never weight the mean."""
    _check_matrix(X)
    n = X.shape[0]
    if f < 0 or m < 0:
        raise ValueError("krum f and m must be >= 0")
    if n == 1:
        return X[0].clone(), [0]
    d2 = pairwise_sq_distances(gram(X))
    d2.fill_diagonal_(math.inf)  # a row is never its own neighbour
    neighbours = min(max(n - f - 2, 1), n - 1)
    scores = d2.topk(neighbours, dim=1, largest=False).values.sum(dim=1).tolist()
    count = min(max(n - f if m == 0 else m, 1), n)
    selected = sorted(sorted(range(n), key=lambda i: (scores[i], i))[:count])
    return _weighted_rows(X, [1.0 / count if i in selected else 0.0 for i in range(n)]), selected


def coordinate_median(X: torch.Tensor) -> torch.Tensor:
    _check_matrix(X)
    n = X.shape[0]

    def med(block: torch.Tensor) -> torch.Tensor:
        v = _sorted_columns(block)
        return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
    return _columnwise(X, med)


def trim_count(n: int, beta: float) -> int:
    """⌊βn⌋ values cut per side (a tiny epsilon absorbs float error such as 0.29·100 = 28.999…)."""
    if not 0 <= beta < 0.5:
        raise ValueError(f"trim beta must be in [0, 0.5), got {beta}")
    return min(int(math.floor(beta * n + 1e-9)), (n - 1) // 2)


def trimmed_mean(X: torch.Tensor, beta: float) -> torch.Tensor:
    _check_matrix(X)
    n = X.shape[0]
    k = trim_count(n, beta)
    return _columnwise(X, lambda block: _sorted_columns(block)[k:n - k].mean(dim=0))


def geometric_median(X: torch.Tensor, nu: float = 1e-6, rtol: float = 1e-10,
                     max_iter: int = 1000) -> tuple[torch.Tensor, int]:
    """Geometric median argmin_z Σ‖x_i − z‖ by smoothed Weiszfeld from the mean.

    z = Σ a_i x_i with a ∝ 1/max(ν, ‖x_i − z‖).  Stops when the step ‖z_{k+1} − z_k‖ is at
    most ``rtol`` × the harmonic mean of the (floored) distances of the rows to z_k — a scale-free
    yardstick that far outliers cannot inflate — or after ``max_iter``.  Returns (median, iterations)."""
    _check_matrix(X)
    n = X.shape[0]
    G = gram(X)
    sq = G.diagonal()
    a = torch.full((n,), 1.0 / n, dtype=torch.float64, device=X.device)
    iterations = 0
    for _ in range(max_iter):
        iterations += 1
        dist = (sq - 2.0 * (G @ a) + a @ G @ a).clamp_min(0.0).sqrt()
        w = 1.0 / dist.clamp_min(nu)
        new = w / w.sum()
        diff = new - a
        step = math.sqrt(max(float(diff @ G @ diff), 0.0))
        a = new
        if step <= rtol * n / float(w.sum()):
            break
    return _weighted_rows(X, a.tolist()), iterations


# -------------------------------------------------------------- dispatcher
def robust_aggregate(rule: str, X: torch.Tensor, hp: HParams, ids: Sequence[int] | None = None,
                     consensus: torch.Tensor | None = None) -> tuple[torch.Tensor, AggregationInfo]:
    """Aggregate the rows of X with ``rule`` (one of :data:`RULES`) after dropping non-finite rows
    and, when ``hp.coherence_threshold > -1``, rows incoherent with ``consensus`` (default: the
    coordinate median of the finite rows, itself robust to a Byzantine minority).

    Never raises on peer data: with no usable row the aggregate is zeros (no step)."""
    if rule not in RULES:
        raise ValueError(f"unknown aggregation rule {rule!r}; choose one of {', '.join(RULES)}")
    _check_matrix(X)
    info = AggregationInfo(rule)
    X, kept, info.dropped = drop_non_finite(X, ids)
    zeros = torch.zeros(X.shape[1], dtype=X.dtype, device=X.device)
    if not kept:
        info.notes.append("no finite update: aggregate is zero")
        return zeros, info
    threshold = float(getattr(hp, "coherence_threshold", -1.0))
    if threshold > -1:
        direction = coordinate_median(X) if consensus is None else consensus
        cos = cosines_to(X, direction)
        mask = coherence_filter(X, direction, threshold)
        info.incoherent = {i: float(c) for i, c, ok in zip(kept, cos.tolist(), mask.tolist(), strict=True) if not ok}
        if not bool(mask.all()):
            X, kept = X[mask], [i for i, ok in zip(kept, mask.tolist(), strict=True) if ok]
        if not kept:
            info.notes.append("every update failed the coherence gate: aggregate is zero")
            return zeros, info
    info.kept = kept
    info.selected = list(kept)
    if rule == "mean":
        out = mean(X)
    elif rule == "krum":
        n, f = len(kept), int(hp.krum_f)
        if n < 2 * f + 3:
            info.notes.append(f"Multi-Krum guarantee needs n >= 2f+3 (n={n}, f={f})")
        out, rows = multi_krum(X, f, int(hp.krum_m))
        info.selected = [kept[r] for r in rows]
    elif rule == "median":
        out = coordinate_median(X)
    elif rule == "trimmed_mean":
        out = trimmed_mean(X, float(hp.trim_beta))
    else:
        out, info.iterations = geometric_median(X)
    return out, info


# ------------------------------------------------- codec-level convenience
def decoded_rows(codec: Codec, updates: list[Update], device: str | torch.device = "cpu") -> torch.Tensor:
    """Stack each peer's decoded update, every tensor scaled by 1/‖codec values‖ (the same
    per-tensor normalisation as ``codec.mean_delta``; decode is linear).  A tensor whose values
    have no finite non-zero norm contributes zeros."""
    rows = []
    for update in updates:
        parts = []
        for name, shape in codec.shapes.items():
            norm = torch.linalg.vector_norm(codec.values(update[name]).double())
            if torch.isfinite(norm) and norm > 0:
                parts.append((codec.to_dense(name, update[name], device).double() / norm).float().reshape(-1))
            else:
                parts.append(torch.zeros(math.prod(shape), device=device))
        rows.append(torch.cat(parts))
    return torch.stack(rows)


def split_vector(vector: torch.Tensor, shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """Inverse of the row layout of :func:`decoded_rows` (tensors in ``shapes`` order)."""
    out, start = {}, 0
    for name, shape in shapes.items():
        size = math.prod(shape)
        out[name] = vector[start:start + size].reshape(shape)
        start += size
    if start != vector.numel():
        raise ValueError(f"vector of {vector.numel()} values does not match shapes totalling {start}")
    return out


def robust_delta(codec: Codec, updates: list[Update], hp: HParams, ids: Sequence[int] | None = None,
                 device: str | torch.device = "cpu") -> tuple[dict[str, torch.Tensor], AggregationInfo]:
    """The aggregate Δ (parameter space, not yet signed) under ``hp.aggregation``.

    With the plain mean and no coherence gate this is exactly ``codec.mean_delta`` (same bits as
    the Gauntlet path); otherwise the rule runs on :func:`decoded_rows`."""
    ids = list(range(len(updates))) if ids is None else list(ids)
    rule = hp.aggregation
    if rule == "mean" and hp.coherence_threshold <= -1:
        return codec.mean_delta(updates, device), AggregationInfo("mean", kept=ids, selected=ids)
    if not updates:
        zero = {n: torch.zeros(s, device=device) for n, s in codec.shapes.items()}
        return zero, AggregationInfo(rule, notes=["no updates"])
    vector, info = robust_aggregate(rule, decoded_rows(codec, updates, device), hp, ids)
    return split_vector(vector, codec.shapes), info
