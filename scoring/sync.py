"""SyncScore sample positions and samples — the one function miners and validators share.

Positions are derived from the chain randomness of the window (unknown while
peers train on it), so a peer cannot keep only a fixed set of parameters in
sync.  They are computed with SHA-256 in counter mode rather than a numpy
generator so that every node, on any numpy version, picks the same positions.
Sample ``i`` goes to parameter ``i mod T`` (``T`` parameters in model order),
so every tensor — norms included — is checked once ``n ≥ T``; the position
inside the tensor is uniform and distinct from the tensor's other samples.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping

import torch

from dso.protocol.rejections import Reason, Rejection

Position = tuple[str, int]  # (parameter name, index into the flattened parameter)


def sync_positions(randomness: bytes, shapes: Mapping[str, tuple[int, ...]], n: int) -> list[Position]:
    """``n`` sample positions for one window; ``shapes`` in model (named_parameters) order."""
    names = list(shapes)
    if n <= 0 or not names:
        return []
    sizes = {name: math.prod(shapes[name]) for name in names}
    taken: dict[str, set[int]] = {name: set() for name in names}
    out: list[Position] = []
    counter = 0
    for i in range(n):
        name = names[i % len(names)]
        size = sizes[name]
        if len(taken[name]) >= size:  # tiny tensor exhausted: allow repeats rather than loop forever
            taken[name].clear()
        while True:
            digest = hashlib.sha256(bytes(randomness) + counter.to_bytes(8, "little")).digest()
            counter += 1
            index = int.from_bytes(digest, "little") % size  # bias ≤ size/2^256: negligible
            if index not in taken[name]:
                break
        taken[name].add(index)
        out.append((name, index))
    return out


@torch.no_grad()
def sample_parameters(named: Mapping[str, torch.Tensor], positions: list[Position]) -> torch.Tensor:
    """float32 vector of the parameter values at ``positions`` (a miner's payload, a validator's reference)."""
    if not positions:
        return torch.zeros(0, dtype=torch.float32)
    values = [named[name].detach().reshape(-1)[index].to("cpu", torch.float32) for name, index in positions]
    return torch.stack(values)


def check_sync_vector(values: object, n: int) -> Rejection | None:
    """A peer's sync vector must be a float32 tensor of shape (n,) with finite values."""
    if not isinstance(values, torch.Tensor):
        return Rejection(Reason.MALFORMED, f"sync samples are {type(values).__name__}, not a tensor")
    if values.dtype != torch.float32:
        return Rejection(Reason.BAD_DTYPE, f"sync samples have dtype {values.dtype}, expected float32")
    if tuple(values.shape) != (n,):
        return Rejection(Reason.BAD_SHAPE, f"sync samples have shape {tuple(values.shape)}, expected ({n},)")
    if not bool(torch.isfinite(values).all()):
        return Rejection(Reason.NON_FINITE, "sync samples hold NaN or inf")
    return None
