"""Error feedback and compression of a pseudo-gradient that lies in slices on a node's ranks.

The result is the update one process would compress from the whole pseudo-gradient, bit for bit:

* a parameter whose every slice holds whole chunks (dso/distributed/sharding.py) keeps its error-feedback buffer in
  slices: each rank runs ``e ← β·e + g``, the chunk transform and the top-k of every chunk of its slice (a
  chunk's top-k reads that chunk alone).  The kept values of every rank are exchanged (a small fraction of
  the tensor: k per chunk) so that every rank quantises the tensor's whole set of values in the global
  order — the level table depends on all of them — and subtracts its own part of the quantised update.
  The indices go to the leader, which puts the tensor's update together in the global chunk order;
* any other parameter (no aligned dimension, the sketch codec, or differential privacy, whose clipping
  needs the whole update) is gathered whole on the leader, which runs the ordinary error feedback on it.

Only the leader ends up with the compressed update; the others return None.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from dso.codec.codecs import Codec
from dso.codec.demo import DeMoCodec, Release, TensorUpdate, buffers_state, load_buffers
from dso.distributed.ranks import Ranks, all_gather_flat, gather_flat, gather_whole
from dso.distributed.sharding import LocalPart, assemble, local_part, local_rows, shard_dim


class ShardedFeedback:
    def __init__(self, codec: Codec, beta: float, ranks: Ranks, dims: Mapping[str, int], whole: bool = False):
        """``dims``: the dimension each parameter is sliced along (dso/distributed/fsdp.py); ``whole``: gather every
        parameter (differential privacy clips the whole update)."""
        self.codec, self.beta, self.ranks = codec, beta, ranks
        self.dims = dict(dims)
        self.parts: dict[str, LocalPart] = {}
        if isinstance(codec, DeMoCodec) and not whole:
            for name, plan in codec.plans.items():
                if shard_dim(plan, ranks.world) == dims[name]:
                    self.parts[name] = local_part(plan, dims[name], ranks.rank, ranks.world)
        self.gathered = [n for n in codec.shapes if n not in self.parts]
        self.buffers: dict[str, torch.Tensor] = {}
        for name, shape in codec.shapes.items():
            if name in self.parts:
                self.buffers[name] = torch.zeros(self.parts[name].plan.shape, device=ranks.device)
            elif ranks.leader:
                self.buffers[name] = torch.zeros(shape, device=ranks.device)

    def step(self, slices: Mapping[str, torch.Tensor], window: int, uid: int = 0,
             release: Release | None = None) -> dict[str, TensorUpdate] | None:
        """This window's compressed update from every rank's ``slices`` of the pseudo-gradient (collective).
        ``release`` (the leader's differential privacy) sees the gathered parameters before error feedback."""
        whole: dict[str, torch.Tensor] = {}
        for name in self.gathered:
            gathered = gather_whole(self.ranks, slices[name].float(), self.codec.shapes[name], self.dims[name])
            if gathered is not None:
                whole[name] = gathered
        if self.ranks.leader and release is not None:
            whole = release(whole)
        update = self._sharded(slices, window)
        if not self.ranks.leader:
            return None
        for name in self.gathered:
            update[name] = self._whole(name, whole[name], window, uid)
        return {name: update[name] for name in self.codec.shapes}

    def _whole(self, name: str, grad: torch.Tensor, window: int, uid: int) -> TensorUpdate:
        """The ordinary error feedback (dso.codec.demo.ErrorFeedback.step) on the leader."""
        e = self.buffers[name]
        e.mul_(self.beta).add_(grad.to(e.device, torch.float32))
        u: TensorUpdate = self.codec.compress_tensor(name, e, window, uid)
        e.sub_(self.codec.to_dense(name, u, e.device))
        return u

    def _counts(self, name: str) -> list[int]:
        """Kept values of a sharded parameter on every rank (rank order): its chunks there × k."""
        assert isinstance(self.codec, DeMoCodec)
        plan = self.codec.plans[name]
        return [0 if p.empty else p.plan.n_chunks * self.codec.k(name)
                for p in (local_part(plan, self.dims[name], r, self.ranks.world) for r in range(self.ranks.world))]

    def _sharded(self, slices: Mapping[str, torch.Tensor], window: int) -> dict[str, TensorUpdate]:
        """Error feedback and top-k of every sharded parameter on this rank's slices; one exchange of every
        rank's kept values (each rank then quantises each tensor's whole set, in the global order) and one
        gather of the indices on the leader, for all the parameters together."""
        codec, ranks = self.codec, self.ranks
        if not self.parts:
            return {}
        assert isinstance(codec, DeMoCodec)
        picked = {}
        for name, part in self.parts.items():
            e = self.buffers[name]
            e.mul_(self.beta).add_(slices[name].to(e.device, torch.float32))
            picked[name] = codec.select(name, part.plan.encode(e.float()))
        counts = {name: self._counts(name) for name in self.parts}
        totals = [sum(c[r] for c in counts.values()) for r in range(ranks.world)]
        values = all_gather_flat(ranks, torch.cat([v.reshape(-1) for _, v in picked.values()]), totals)
        indices = gather_flat(ranks, torch.cat([i.reshape(-1) for i, _ in picked.values()]), totals)
        offsets = [0] * ranks.world
        update: dict[str, TensorUpdate] = {}
        for name, part in self.parts.items():
            plan, k = codec.plans[name], codec.k(name)
            mine = [values[r][offsets[r]:offsets[r] + counts[name][r]].reshape(-1, k) for r in range(ranks.world)]
            codes, table = codec.quantise(assemble(plan, part.dim, mine))  # the tensor's kept values, global order
            idx = picked[name][0]
            own = TensorUpdate(idx, local_rows(plan, part, codes), table)
            e = self.buffers[name]
            dense = torch.zeros(part.plan.n_chunks, part.plan.chunk_size, device=e.device)
            dense.scatter_add_(1, idx.to(e.device), codec.values(own).to(e.device))
            e.sub_(part.plan.decode(dense))
            if indices is not None:
                rows = [indices[r][offsets[r]:offsets[r] + counts[name][r]].reshape(-1, k) for r in range(ranks.world)]
                update[name] = TensorUpdate(assemble(plan, part.dim, rows), codes, table)
            offsets = [o + c for o, c in zip(offsets, counts[name], strict=True)]
        return update

    # ------------------------------------------------------------- state
    def state(self) -> dict[str, torch.Tensor]:
        """This rank's buffers (slices, and on the leader the gathered parameters' whole buffers)."""
        return buffers_state(self.buffers)

    def load_state(self, tensors: Mapping[str, torch.Tensor]) -> bool:
        """Restore :meth:`state` of this rank; False (and zeros kept) on any mismatch."""
        return load_buffers(self.buffers, tensors)
