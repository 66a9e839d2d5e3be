"""Where each rank's part of a parameter lies, and which parameters the codec can compress part by part.

FSDP2 (``torch.distributed.fsdp.fully_shard``) splits a parameter along one dimension the way
``torch.chunk`` does: ``ceil(n / world)`` slices each, the last ones shorter or empty.  The codec cuts a
parameter's 1-D or 2-D view into chunks (dso/codec/dct.py) and keeps a top-k of every chunk on its own, so a
rank whose slice holds whole chunks can run error feedback and top-k on its slice alone and get exactly
the chunks a single process gets from the whole tensor.  :func:`shard_dim` picks, per parameter, a
dimension along which every rank's slice holds whole chunks (dim 0 first, then dim 1 of a matrix); a
parameter with none is sharded along dim 0 and compressed on rank 0 after a gather
(dso/distributed/sharded_codec.py).  :func:`assemble` and :func:`local_rows` move chunk rows between the ranks' order
and the global one.  Pure functions of shapes: every rank computes the same layout.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dso.codec.dct import ChunkPlan


def slice_range(n: int, rank: int, world: int) -> tuple[int, int]:
    """``[start, end)`` of rank's slice of a dimension of length ``n`` (``torch.chunk``'s split, as FSDP2)."""
    size = -(-n // world) if n else 0
    start = min(rank * size, n)
    return start, min(start + size, n)


def slice_shape(shape: tuple[int, ...], dim: int, rank: int, world: int) -> tuple[int, ...]:
    """The shape of rank's slice of a tensor of ``shape`` sliced along ``dim``."""
    start, end = slice_range(shape[dim], rank, world)
    return shape[:dim] + (end - start,) + shape[dim + 1:]


def narrow_slice(full: torch.Tensor, dim: int, rank: int, world: int) -> torch.Tensor:
    """Rank's slice of the whole tensor ``full`` (a view)."""
    start, end = slice_range(full.shape[dim], rank, world)
    return full.narrow(dim, start, end - start)


def aligned(n: int, edge: int, world: int) -> bool:
    """Whether every rank's slice of a dimension of length ``n`` starts on a chunk edge (ends follow: each
    slice is the same whole number of chunks, the last one ending at ``n`` where the plan pads)."""
    return world == 1 or (-(-n // world)) % edge == 0


def shard_dim(plan: ChunkPlan, world: int) -> int | None:
    """The dimension of the parameter to shard so that every rank holds whole chunks; None: there is none.

    Only 1-D and 2-D parameters are considered (the model has no others); their view is their shape.  A 1-D
    parameter in the DCT domain is never split: its chunks are transformed by one matrix product over all
    rows, whose last bits depend on how many rows it has (2-D chunks go through a batched product, one
    chunk at a time)."""
    if len(plan.shape) != len(plan.view) or (len(plan.view) == 1 and plan.transform):
        return None
    for dim in range(len(plan.view)):
        if aligned(plan.view[dim], plan.edges[dim], world):
            return dim
    return None


@dataclass(frozen=True)
class LocalPart:
    """One rank's slice of a parameter and of its chunk grid."""

    dim: int                         # the parameter dimension it is sliced along
    start: int                       # first index along ``dim``
    end: int                         # one past the last
    plan: ChunkPlan                  # the slice's own chunk plan: the global edges, padded only at the global end
    grid_offset: int                 # first chunk index along ``dim`` of the global chunk grid

    @property
    def empty(self) -> bool:
        return self.end <= self.start


def local_part(plan: ChunkPlan, dim: int, rank: int, world: int) -> LocalPart:
    """Rank's slice along ``dim`` (which must be aligned: :func:`shard_dim`) and the chunk plan of that slice."""
    start, end = slice_range(plan.shape[dim], rank, world)
    shape = list(plan.shape)
    shape[dim] = end - start
    view = tuple(shape)
    edge = plan.edges[dim]
    padded = list(plan.padded)
    padded[dim] = -(-(end - start) // edge) * edge
    local = ChunkPlan(tuple(shape), view, tuple(padded), plan.edges, plan.transform)
    return LocalPart(dim, start, end, local, start // edge)


def assemble(plan: ChunkPlan, dim: int, pieces: list[torch.Tensor]) -> torch.Tensor:
    """The global chunk rows (``n_chunks`` × k, row-major over the chunk grid) from every rank's chunk rows
    (rank order).  Along dim 0 the ranks' chunks are consecutive blocks of the global order; along dim 1 of
    a matrix every row of the chunk grid holds one block of each rank."""
    if dim == 0:
        return torch.cat(pieces)
    rows = plan.grid[0]
    return torch.cat([p.reshape(rows, -1, *p.shape[1:]) for p in pieces], dim=1).reshape(-1, *pieces[0].shape[1:])


def local_rows(plan: ChunkPlan, part: LocalPart, rows: torch.Tensor) -> torch.Tensor:
    """Rank's chunk rows out of the global ones (the inverse of :func:`assemble` for one rank)."""
    count = 0 if part.empty else part.plan.n_chunks
    if part.dim == 0:
        first = part.grid_offset * (plan.grid[1] if len(plan.grid) == 2 else 1)
        return rows[first:first + count]
    grid = rows.reshape(plan.grid[0], plan.grid[1], *rows.shape[1:])
    width = 0 if part.empty else part.plan.grid[1]
    return grid[:, part.grid_offset:part.grid_offset + width].reshape(-1, *rows.shape[1:])
