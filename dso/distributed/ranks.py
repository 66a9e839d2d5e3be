"""One node as a group of ranks (``torchrun --nproc_per_node N``): the process group and its few collectives.

torchrun sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` in every process it starts; a node started without
it (``python neurons/miner.py``) has no group and runs as before.  The backend follows the device: gloo on
the CPU, NCCL on CUDA (one GPU per rank, ``cuda:LOCAL_RANK``).  Rank 0 is the leader: it alone talks to S3
and the chain, and tells the other ranks what to do next (neurons/ranks.py); everything here is
collective, called by every rank of the group in the same order.

Messages between ranks are JSON (as bytes in a uint8 tensor) or plain tensors: no pickle crosses a rank
boundary, although every rank belongs to the same operator.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import datetime
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dso.distributed.sharding import slice_shape

# A rank that waits for the leader's next order (while the leader sleeps to the put window, waits for the
# leader's checkpoint or for a bundle) waits inside a collective: the group's timeout must outlast any idle
# stretch of a node.  A rank that dies ends the whole group anyway (torchrun stops the others).
IDLE_TIMEOUT = datetime.timedelta(days=7)
MESSAGE_BYTES = 1024  # a JSON message up to this size (with its length) crosses in one broadcast


@dataclass(frozen=True)
class Ranks:
    """This process's place in its node's group."""

    rank: int
    world: int
    device: torch.device       # this rank's device (cuda:LOCAL_RANK with NCCL)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @property
    def comm_device(self) -> torch.device:
        """Where tensors that cross ranks must be: the GPU under NCCL, the CPU under gloo."""
        return self.device if self.device.type == "cuda" else torch.device("cpu")


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:  # not glibc
        return None


_LIBC = _libc()
M_MMAP_THRESHOLD = -3            # glibc's mallopt parameter
MMAP_THRESHOLD_BYTES = 1 << 20   # tensors of 1 MiB and more get their own mapping, returned when freed


def return_freed_tensors() -> None:
    """Make glibc give every allocation of MMAP_THRESHOLD_BYTES or more its own mapping, returned to the system
    when freed (a no-op elsewhere).  By default glibc raises that threshold up to 32 MiB as large blocks are
    freed, and keeps what falls under it in the heap: a training step's activations and gathered blocks then
    stay resident after they are freed (measured: the 125m preset's forward grew a rank's resident memory by
    the 28 MB of each block, activation checkpointing or not).  Set once, at a rank's start."""
    if _LIBC is not None:
        _LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def release_free_memory() -> None:
    """Hand the allocator's free memory back to the system (glibc ``malloc_trim``; a no-op elsewhere).

    A training step frees as much as it allocated (activations, all-gathered blocks, reduce-scatter
    buffers), but glibc keeps freed chunks below its mmap threshold in the heap, so a rank's resident
    memory grows step after step by what the previous steps left behind (+430 MB after the second step of
    the 125m preset, measured); trimming after each step keeps it at what the step holds."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def launched_ranks() -> int:
    """The group size torchrun launched this process in (1 when started plainly)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def join_group(device: str | torch.device) -> Ranks:
    """Join the group torchrun started (gloo on the CPU, NCCL on CUDA); the device becomes the rank's own GPU."""
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    dev = torch.device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=rank, world_size=world,
                                timeout=IDLE_TIMEOUT)
    return Ranks(rank, world, dev)


def leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


# ------------------------------------------------------------ collectives
def broadcast_json(ranks: Ranks, value: Any = None) -> Any:
    """The leader's JSON value on every rank (the others pass nothing).  One collective when it fits in
    MESSAGE_BYTES (an order does), two otherwise."""
    data = json.dumps(value).encode() if ranks.leader else b""
    head = torch.zeros(MESSAGE_BYTES, dtype=torch.uint8)
    if ranks.leader:
        first = len(data).to_bytes(8, "little") + data[:MESSAGE_BYTES - 8]
        head[:len(first)] = torch.frombuffer(bytearray(first), dtype=torch.uint8)
    head = head.to(ranks.comm_device)
    dist.broadcast(head, 0)
    raw = bytes(head.cpu().numpy().tobytes())
    size = int.from_bytes(raw[:8], "little")
    rest = torch.empty(max(0, size - (MESSAGE_BYTES - 8)), dtype=torch.uint8)
    if ranks.leader and rest.numel():
        rest = torch.frombuffer(bytearray(data[MESSAGE_BYTES - 8:]), dtype=torch.uint8)
    if rest.numel():
        rest = rest.to(ranks.comm_device)
        dist.broadcast(rest, 0)
    body = raw[8:8 + min(size, MESSAGE_BYTES - 8)] + bytes(rest.cpu().numpy().tobytes())
    return json.loads(body.decode())


def broadcast_tensor(ranks: Ranks, tensor: torch.Tensor | None, shape: tuple[int, ...],
                     dtype: torch.dtype) -> torch.Tensor:
    """The leader's tensor (of the given shape and dtype) on every rank, on the rank's communication device."""
    if ranks.leader:
        assert tensor is not None and tuple(tensor.shape) == tuple(shape) and tensor.dtype == dtype
        buf = tensor.to(ranks.comm_device).contiguous()
    else:
        buf = torch.empty(shape, dtype=dtype, device=ranks.comm_device)
    if buf.numel():
        dist.broadcast(buf, 0)
    return buf


def broadcast_flag(ranks: Ranks, flag: bool) -> bool:
    """The leader's yes/no on every rank."""
    t = torch.tensor([1 if flag else 0], dtype=torch.uint8, device=ranks.comm_device)
    dist.broadcast(t, 0)
    return bool(t.item())


def all_sum(ranks: Ranks, values: list[float]) -> list[float]:
    """Element-wise sums over the ranks (float64)."""
    t = torch.tensor(values, dtype=torch.float64, device=ranks.comm_device)
    dist.all_reduce(t)
    return [float(x) for x in t.cpu()]


def gather_rows(ranks: Ranks, rows: torch.Tensor, shapes: Sequence[tuple[int, ...]]) -> list[torch.Tensor] | None:
    """Every rank's ``rows`` on the leader (rank order; ``shapes`` says what each rank sends); None elsewhere."""
    if not ranks.leader:
        if rows.numel():
            dist.send(rows.to(ranks.comm_device).contiguous(), 0)
        return None
    out = [rows.cpu()]
    for r in range(1, ranks.world):
        piece = torch.empty(shapes[r], dtype=rows.dtype, device=ranks.comm_device)
        if piece.numel():
            dist.recv(piece, r)
        out.append(piece.cpu())
    return out


def gather_whole(ranks: Ranks, mine: torch.Tensor, shape: tuple[int, ...], dim: int) -> torch.Tensor | None:
    """The whole tensor of ``shape`` on the leader (None elsewhere), from every rank's slice of it along ``dim``."""
    pieces = gather_rows(ranks, mine.detach(), [slice_shape(shape, dim, r, ranks.world) for r in range(ranks.world)])
    return None if pieces is None else torch.cat(pieces, dim=dim)


def all_gather_flat(ranks: Ranks, flat: torch.Tensor, sizes: Sequence[int]) -> list[torch.Tensor]:
    """Every rank's 1-D ``flat`` on every rank (rank order), where ``sizes[r]`` is what rank r holds (known
    to all: no sizes are exchanged).  One collective, whatever the number of tensors packed in ``flat``."""
    longest = max(sizes)
    padded = torch.zeros(longest, dtype=flat.dtype, device=ranks.comm_device)
    padded[:flat.numel()] = flat.to(ranks.comm_device)
    out = [torch.empty_like(padded) for _ in range(ranks.world)]
    dist.all_gather(out, padded)
    return [o[:n].cpu() for o, n in zip(out, sizes, strict=True)]


def gather_flat(ranks: Ranks, flat: torch.Tensor, sizes: Sequence[int]) -> list[torch.Tensor] | None:
    """Every rank's 1-D ``flat`` (``sizes[r]`` elements on rank r) on the leader; None elsewhere."""
    return gather_rows(ranks, flat.reshape(-1), [(n,) for n in sizes])
