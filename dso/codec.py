"""DeMo codec: chunked DCT → top-k per chunk → low-precision values, with error feedback.

A :class:`CompressedUpdate` maps parameter name → :class:`TensorUpdate`
(indices, value codes, scale).  It is exactly what goes on the wire, so a
decoded payload equals the in-memory update bit for bit.  ``DeMoCodec.values``
turns codes back into floats; ``DeMoCodec.to_dense`` decodes to parameter
space.  :class:`ErrorFeedback` implements
``e ← β·e + g;  q ← TopK(DCT(e));  e ← e − IDCT(q)`` with the *quantised* q,
so quantisation error is fed back too.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

import numpy as np
import torch

from dso.dct import ChunkPlan
from dso.packing import EliasFano, PackingError, codes_nbytes, index_bound_bits, pack_codes, unpack_codes

if TYPE_CHECKING:
    from dso.codecs import Codec
    from dso.config import HParams


@dataclass
class TensorUpdate:
    idx: torch.Tensor    # int64 (n_chunks, k), ascending per row
    codes: torch.Tensor  # uint8 (n_chunks, k) level codes, or float32 values when value_bits == 32
    scale: torch.Tensor  # float32 (2,) = (smallest, largest) kept magnitude; empty for float32 values


CompressedUpdate = dict[str, TensorUpdate]


class LogGridQuantiser:
    """Sign bit + (bits-1)-bit level on a log grid between the tensor's min and max kept magnitude."""

    def __init__(self, bits: int):
        self.bits = bits
        self.levels = 2 ** (bits - 1)

    def quantise(self, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mag = v.abs()
        nz = mag[mag > 0]
        if nz.numel() == 0:
            return torch.zeros(v.shape, dtype=torch.uint8), torch.zeros(2)
        lo, hi = nz.min(), nz.max()
        step = (hi.log() - lo.log()) / (self.levels - 1)
        if step > 0:
            level = ((mag.clamp_min(lo).log() - lo.log()) / step).round().clamp(0, self.levels - 1)
        else:
            level = torch.zeros_like(mag)
        codes = level.to(torch.uint8) | ((v < 0).to(torch.uint8) << (self.bits - 1))
        return codes, torch.stack([lo, hi]).float()

    def dequantise(self, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        lo, hi = float(scale[0]), float(scale[1])
        if hi == 0.0:
            return torch.zeros(codes.shape)
        codes = codes.to(torch.int64)
        level = (codes & (self.levels - 1)).double()
        step = (math.log(hi) - math.log(lo)) / (self.levels - 1)
        mag = torch.exp(math.log(lo) + level * step)
        sign = 1.0 - 2.0 * ((codes >> (self.bits - 1)) & 1).double()
        return (sign * mag).float()


@dataclass
class DeMoCodec:
    shapes: dict[str, tuple[int, ...]]
    chunk: int = 64
    topk: int = 32
    value_bits: int = 4
    plans: dict[str, ChunkPlan] = field(init=False)

    def __post_init__(self) -> None:
        self.plans = {n: ChunkPlan.for_shape(s, self.chunk) for n, s in self.shapes.items()}
        self.quantiser = LogGridQuantiser(self.value_bits) if self.value_bits <= 8 else None

    @classmethod
    def from_hparams(cls, shapes: dict[str, tuple[int, ...]], hp: HParams) -> "DeMoCodec":
        return cls(shapes, chunk=hp.chunk, topk=hp.topk, value_bits=hp.value_bits)

    def k(self, name: str) -> int:
        return min(self.topk, self.plans[name].chunk_size)

    def index_coder(self, name: str) -> EliasFano:
        return EliasFano(self.plans[name].chunk_size, self.k(name))

    def settings(self) -> dict[str, str]:
        """What a receiver must agree on to read an update (goes into payload metadata)."""
        return {"codec": "demo", "chunk": str(self.chunk), "topk": str(self.topk), "value_bits": str(self.value_bits)}

    # --------------------------------------------------------- compress
    def compress_tensor(self, name: str, x: torch.Tensor, window: int, uid: int = 0) -> TensorUpdate:
        """Top-k of the chunked DCT of ``x`` (DeMo's transform is the same in every window)."""
        coeffs = self.plans[name].encode(x.float())
        idx = coeffs.abs().topk(self.k(name), dim=1, sorted=False).indices.sort(dim=1).values
        vals = coeffs.gather(1, idx).cpu()
        if self.quantiser is None:
            codes, scale = vals.clone(), torch.zeros(0)
        else:
            codes, scale = self.quantiser.quantise(vals)
        return TensorUpdate(idx.cpu(), codes, scale)

    def compress(self, tensors: Mapping[str, torch.Tensor], window: int, uid: int = 0) -> CompressedUpdate:
        return {n: self.compress_tensor(n, t, window, uid) for n, t in tensors.items()}

    # ------------------------------------------------------- decompress
    def values(self, u: TensorUpdate) -> torch.Tensor:
        if self.quantiser is None:
            return u.codes.float()
        return self.quantiser.dequantise(u.codes, u.scale)

    def scatter(self, name: str, idx: torch.Tensor, vals: torch.Tensor,
                device: str | torch.device = "cpu") -> torch.Tensor:
        """Sparse (idx, vals) → dense DCT-domain (n_chunks, chunk_size)."""
        plan = self.plans[name]
        dense = torch.zeros(plan.n_chunks, plan.chunk_size, device=device)
        return dense.scatter_add_(1, idx.to(device), vals.to(device))

    def to_dense(self, name: str, u: TensorUpdate, device: str | torch.device = "cpu") -> torch.Tensor:
        return self.plans[name].decode(self.scatter(name, u.idx, self.values(u), device))

    def decompress(self, update: CompressedUpdate, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        return {n: self.to_dense(n, u, device) for n, u in update.items()}

    def normalised_values(self, u: TensorUpdate) -> torch.Tensor | None:
        """A peer's values for one tensor scaled to unit L2 norm; None when they carry no direction."""
        vals = self.values(u)
        norm = torch.linalg.vector_norm(vals)
        if not torch.isfinite(norm) or norm == 0:
            return None
        unit: torch.Tensor = vals / norm
        return unit

    def mean_delta(self, updates: list[CompressedUpdate],
                   device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        """Decoded mean of per-tensor L2-normalised updates (DCT domain), not yet signed.

        Normalising makes a ×1000-scaled update count exactly as much as the unscaled one."""
        out: dict[str, torch.Tensor] = {}
        for name, plan in self.plans.items():
            acc = torch.zeros(plan.n_chunks, plan.chunk_size, device=device)
            for update in updates:
                vals = self.normalised_values(update[name])
                if vals is not None:
                    acc.scatter_add_(1, update[name].idx.to(device), vals.to(device))
            if updates:
                acc /= len(updates)
            out[name] = plan.decode(acc)
        return out

    # ------------------------------------------------------------- wire
    def wire_spec(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Exact tensor set of an encoded update: key → (numpy dtype name, shape)."""
        return dict(self._wire_spec)  # a copy: callers may extend it

    @functools.cached_property
    def _wire_spec(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        # Fixed by the shapes and settings; gather needs it several times per peer, so build it once.
        spec: dict[str, tuple[str, tuple[int, ...]]] = {}
        for n, plan in self.plans.items():
            count = plan.n_chunks * self.k(n)
            spec[f"{n}.idx"] = ("uint8", (self.index_coder(n).nbytes(plan.n_chunks),))
            if self.quantiser:
                spec[f"{n}.val"] = ("uint8", (codes_nbytes(count, self.value_bits),))
                spec[f"{n}.scale"] = ("float32", (2,))
            else:
                spec[f"{n}.val"] = ("float32", (count,))
        return spec

    def to_wire(self, update: CompressedUpdate) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for n, u in update.items():
            out[f"{n}.idx"] = self.index_coder(n).pack(u.idx.numpy())
            if self.quantiser:
                out[f"{n}.val"] = pack_codes(u.codes.numpy().reshape(-1), self.value_bits)
                out[f"{n}.scale"] = u.scale.numpy().astype(np.float32)
            else:
                out[f"{n}.val"] = u.codes.numpy().reshape(-1).astype(np.float32)
        return out

    def from_wire(self, tensors: dict[str, np.ndarray], window: int) -> CompressedUpdate:
        """Inverse of :meth:`to_wire` for tensors already matching :meth:`wire_spec`.

        Raises :class:`PackingError` (reason = a Reason value) on any content violation."""
        update: CompressedUpdate = {}
        for n, plan in self.plans.items():
            k = self.k(n)
            idx = torch.from_numpy(self.index_coder(n).unpack(tensors[f"{n}.idx"], plan.n_chunks))
            if self.quantiser:
                scale = np.asarray(tensors[f"{n}.scale"], dtype=np.float32)
                if not np.isfinite(scale).all():
                    raise PackingError("non_finite", f"{n}: non-finite scale")
                lo, hi = float(scale[0]), float(scale[1])
                if not (0 < lo <= hi or lo == hi == 0):
                    raise PackingError("bad_encoding", f"{n}: scale must satisfy 0 < lo <= hi (or both 0)")
                codes = unpack_codes(tensors[f"{n}.val"], plan.n_chunks * k, self.value_bits)
                update[n] = TensorUpdate(idx, torch.from_numpy(codes.reshape(plan.n_chunks, k)),
                                         torch.from_numpy(scale.copy()))
            else:
                vals = np.asarray(tensors[f"{n}.val"], dtype=np.float32)
                if not np.isfinite(vals).all():
                    raise PackingError("non_finite", f"{n}: non-finite value")
                update[n] = TensorUpdate(idx, torch.from_numpy(vals.reshape(plan.n_chunks, k).copy()),
                                         torch.zeros(0))
        return update

    # ------------------------------------------------------------ sizes
    def kept(self) -> int:
        return sum(self.plans[n].n_chunks * self.k(n) for n in self.plans)

    def payload_bytes(self) -> int:
        """Bytes of indices + values + scales for the whole model (no container overhead)."""
        return sum(math.prod(shape) * np.dtype(dtype).itemsize for dtype, shape in self.wire_spec().values())

    def bound_bytes_per_kept(self) -> float:
        """Information bound: log2 C(chunk, k) / k index bits + the value bits sent, in bytes."""
        bits = 0.0
        for n, plan in self.plans.items():
            count = plan.n_chunks * self.k(n)
            bits += count * (index_bound_bits(plan.chunk_size, self.k(n)) + self.value_bits)
        return bits / 8 / self.kept()


class ErrorFeedback:
    """Per-parameter residual buffers e, kept on the miner (and saved across restarts)."""

    def __init__(self, codec: Codec, beta: float, device: str | torch.device = "cpu"):
        self.codec, self.beta = codec, beta
        self.buffers = {n: torch.zeros(s, device=device) for n, s in codec.shapes.items()}

    def step(self, grads: Mapping[str, torch.Tensor], window: int, uid: int = 0) -> CompressedUpdate:
        update: CompressedUpdate = {}
        for name, e in self.buffers.items():
            e.mul_(self.beta).add_(grads[name].to(e.device, torch.float32))
            u = self.codec.compress_tensor(name, e, window, uid)
            e.sub_(self.codec.to_dense(name, u, e.device))
            update[name] = u
        return update

    def state(self) -> dict[str, torch.Tensor]:
        return {f"ef.{n}": b.detach().cpu().contiguous() for n, b in self.buffers.items()}

    def load_state(self, tensors: dict[str, torch.Tensor]) -> bool:
        """Restore buffers saved by :meth:`state`; returns False (and keeps zeros) on any mismatch."""
        want = {f"ef.{n}": b.shape for n, b in self.buffers.items()}
        if set(tensors) != set(want) or any(tensors[k].shape != s for k, s in want.items()):
            return False
        if not all(bool(torch.isfinite(t).all()) for t in tensors.values()):
            return False
        for n, b in self.buffers.items():
            b.copy_(tensors[f"ef.{n}"])
        return True

