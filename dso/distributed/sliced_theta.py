"""The node's θ as slices on its ranks: what a miner on several ranks follows the network with.

Every rank holds its slice of every parameter of θ_{model_window} — the inner loop's anchor
(dso/distributed/sharded_inner.py), sliced as FSDP slices the parameter (dso/distributed/sharding.py) — and
no rank holds the whole θ.  What the protocol does with θ is done here, collectively, and gives exactly
what one process gives with the whole model:

* :meth:`SlicedTheta.hash`: every tensor gathered to the leader one at a time and hashed in the model's
  order — :func:`dso.nn.model.model_hash`'s bytes;
* :meth:`SlicedTheta.sample`: the values at SyncScore's positions, each read by the rank that holds it;
* :meth:`SlicedTheta.step`: the network's outer step (a bundle applied), tensor by tensor: the leader decodes
  one tensor of Δ and takes the rule's direction (with the outer state, which it alone keeps), every rank
  steps its own rows with :func:`dso.training.outer.outer_step_tensor`, elementwise as in one process;
* :meth:`SlicedTheta.load` and :meth:`SlicedTheta.load_checkpoint`: θ_0 or a checkpoint, one tensor (or one
  rank's slice of it) at a time from the leader.

Each method is collective: on the leader it first announces itself (``announce``, neurons/ranks.py), and
the other ranks call :meth:`SlicedTheta.handle`, as for the inner loop.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist

from dso.config.schema import HParams
from dso.distributed.ranks import Ranks, all_sum, gather_flat, gather_whole
from dso.distributed.sharding import narrow_slice, slice_range, slice_shape
from dso.nn.model import state_hash
from dso.training.outer import OuterState, outer_step_tensor
from dso.training.outer_rules import outer_rule

Announce = Callable[[str, dict[str, Any]], None]
Position = tuple[str, int]  # a parameter and a flat index into it (scoring/sync.py)


class SliceReader(Protocol):
    """A verified checkpoint that reads any slice of a tensor (storage/checkpoint.py ``LoadedCheckpoint``)."""

    def read(self, name: str, dim: int = 0, start: int = 0, end: int | None = None) -> torch.Tensor: ...


class SlicedTheta:
    def __init__(self, slices: Mapping[str, torch.Tensor], shapes: Mapping[str, tuple[int, ...]],
                 dims: Mapping[str, int], ranks: Ranks, hp: HParams, announce: Announce | None = None):
        """``slices``: this rank's slice of every parameter, in the model's order (written in place);
        ``shapes``: the whole parameters' shapes; ``dims``: the dimension each is sliced along; ``hp``: the
        run's hyper-parameters (the same on every rank); ``announce``: the leader's way to tell the others."""
        self.slices, self.shapes, self.dims = dict(slices), dict(shapes), dict(dims)
        self.ranks, self.hp, self._announce = ranks, hp, announce
        if list(self.slices) != list(self.shapes):
            raise ValueError("the slices and the shapes must name the same parameters in the same order")

    def announce(self, op: str, **args: Any) -> None:
        if self._announce is not None:
            self._announce(op, args)

    def handle(self, op: str, args: Mapping[str, Any]) -> None:
        """Take part in an operation the leader announced (on the other ranks)."""
        if op == "hash":
            self.hash()
        elif op == "sample":
            self.sample([(str(n), int(i)) for n, i in args["positions"]])
        elif op == "step":
            self.step({}, OuterState(), self.hp, int(args["window"]))
        elif op == "load":
            self._receive_all()
        else:
            raise ValueError(f"unknown θ operation {op!r}")

    # ------------------------------------------------------------ moving slices
    def part_shape(self, name: str, rank: int) -> tuple[int, ...]:
        return slice_shape(self.shapes[name], self.dims[name], rank, self.ranks.world)

    def distribute(self, name: str, piece: Callable[[int], torch.Tensor] | None) -> torch.Tensor:
        """This rank's part of one tensor: the leader makes every rank's (``piece(rank)``) and sends it; the
        others receive theirs.  Float32, on the slice's device."""
        ranks, device = self.ranks, self.slices[name].device
        if ranks.leader:
            assert piece is not None
            for rank in range(1, ranks.world):
                part = piece(rank).to(ranks.comm_device, torch.float32).contiguous()
                if part.numel():
                    dist.send(part, rank)
            return piece(0).to(device, torch.float32)
        buf = torch.empty(self.part_shape(name, ranks.rank), dtype=torch.float32, device=ranks.comm_device)
        if buf.numel():
            dist.recv(buf, 0)
        return buf.to(device)

    def gather(self, name: str) -> torch.Tensor | None:
        """The whole tensor on the leader (None elsewhere), from every rank's slice."""
        return gather_whole(self.ranks, self.slices[name], self.shapes[name], self.dims[name])

    # ------------------------------------------------------------ what the protocol does with θ
    @torch.no_grad()
    def hash(self) -> str:
        """:func:`dso.nn.model.model_hash` of θ on the leader ("" elsewhere): the tensors gathered one at a time
        (every rank takes part in each gather; only the leader has tensors to hash)."""
        self.announce("hash")
        gathered = ((name, self.gather(name)) for name in self.slices)
        digest = state_hash((name, whole) for name, whole in gathered if whole is not None)
        return digest if self.ranks.leader else ""

    @torch.no_grad()
    def sample(self, positions: Sequence[Position]) -> torch.Tensor:
        """float32 values of θ at ``positions`` on the leader (as :func:`scoring.sync.sample_parameters` reads
        them from the whole model); an empty tensor elsewhere."""
        self.announce("sample", positions=[[n, i] for n, i in positions])
        owners = [self.owner(n, i) for n, i in positions]
        rank = self.ranks.rank
        mine = [self.slices[positions[k][0]].detach().reshape(-1)[local].to("cpu", torch.float32)
                for k, (r, local) in enumerate(owners) if r == rank]
        sizes = [sum(1 for r, _ in owners if r == q) for q in range(self.ranks.world)]
        values = torch.stack(mine) if mine else torch.zeros(0, dtype=torch.float32)
        pieces = gather_flat(self.ranks, values, sizes)
        if pieces is None:
            return torch.zeros(0, dtype=torch.float32)
        out = torch.zeros(len(positions), dtype=torch.float32)
        for q, piece in enumerate(pieces):
            held = [k for k, (r, _) in enumerate(owners) if r == q]
            if held:
                out[held] = piece
        return out

    def owner(self, name: str, index: int) -> tuple[int, int]:
        """(the rank holding flat ``index`` of parameter ``name``, the flat index into that rank's slice)."""
        shape, dim, world = self.shapes[name], self.dims[name], self.ranks.world
        coords, rest = [], index
        for size in reversed(shape):
            coords.append(rest % size)
            rest //= size
        coords.reverse()
        for rank in range(world):
            start, end = slice_range(shape[dim], rank, world)
            if start <= coords[dim] < end:
                break
        coords[dim] -= start
        local = 0
        for size, c in zip(self.part_shape(name, rank), coords, strict=True):
            local = local * size + c
        return rank, local

    @torch.no_grad()
    def step(self, delta: Mapping[str, torch.Tensor], outer: OuterState, hp: HParams, window: int) -> float:
        """The run's outer step with the aggregate Δ (the leader's, read one tensor at a time — a
        :class:`dso.training.outer.StreamedDelta` is decoded as it goes; ignored elsewhere), as
        :func:`dso.training.outer.apply_outer`: θ and the leader's outer state in place; the mean |θ_{t+1} − θ_t|
        per parameter (summed over the ranks: equal to one process's up to the order of the sum)."""
        if hp.outer != self.hp.outer:
            raise ValueError("a sliced θ steps with the run's outer rule only")
        self.announce("step", window=window)
        rule = outer_rule(self.hp)
        lr = rule.lr(window)
        moved, count = 0.0, 0
        for name, mine in self.slices.items():
            d = rule.direction(name, delta[name].to(torch.float32), outer.momentum) if self.ranks.leader else None
            part = self.distribute(name, None if d is None else self._slicer(name, d))
            moved += outer_step_tensor(mine, part, rule, lr)
            count += math.prod(self.shapes[name])
            del d, part  # before the leader decodes the next tensor of Δ
        if self.ranks.leader:
            outer.steps += 1
        return all_sum(self.ranks, [moved])[0] / max(count, 1)

    @torch.no_grad()
    def load(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """θ ← the leader's whole tensors, given one at a time in the model's order (e.g.
        :func:`dso.nn.model.initial_tensors`); the other ranks pass nothing."""
        self.announce("load")
        if not self.ranks.leader:
            self._receive_all()
            return
        for name, (given, whole) in zip(self.slices, tensors, strict=True):
            if given != name or tuple(whole.shape) != self.shapes[name]:
                raise ValueError(f"θ's tensors out of order: {given} {tuple(whole.shape)} for {name}")
            self.slices[name].copy_(self.distribute(name, self._slicer(name, whole)))

    @torch.no_grad()
    def load_checkpoint(self, checkpoint: SliceReader) -> None:
        """θ ← a verified checkpoint the leader holds, each rank's slice read on its own (no whole tensor)."""
        self.announce("load")
        if not self.ranks.leader:
            self._receive_all()
            return
        for name, mine in self.slices.items():
            mine.copy_(self.distribute(name, functools.partial(self._read, checkpoint, name)))

    def _receive_all(self) -> None:
        for name, mine in self.slices.items():
            mine.copy_(self.distribute(name, None))

    def _slicer(self, name: str, whole: torch.Tensor) -> Callable[[int], torch.Tensor]:
        return lambda rank: narrow_slice(whole, self.dims[name], rank, self.ranks.world)

    def _read(self, checkpoint: SliceReader, name: str, rank: int) -> torch.Tensor:
        shape, dim = self.part_shape(name, rank), self.dims[name]
        if not math.prod(shape):
            return torch.zeros(shape, dtype=torch.float32)
        start, end = slice_range(self.shapes[name][dim], rank, self.ranks.world)
        return checkpoint.read(name, dim, start, end)
