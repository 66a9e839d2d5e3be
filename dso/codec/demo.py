"""DeMo codec: chunked DCT (or raw chunks) → top-k per chunk → low-precision values, with error feedback.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from dso.codec.codecs import DEFAULT_THRESHOLDS, NearCopyThresholds, unit_vector
from dso.codec.dct import ChunkPlan
from dso.codec.packing import EliasFano, PackingError, codes_nbytes, index_bound_bits, pack_codes, unpack_codes
from dso.nn.model import parameter_kind

if TYPE_CHECKING:
    from dso.codec.codecs import TensorCodec
    from dso.config.schema import HParams


@dataclass
class TensorUpdate:
    idx: torch.Tensor    # int64 (n_chunks, k), ascending per row
    codes: torch.Tensor  # uint8 (n_chunks, k) level codes, or float32 values when value_bits == 32
    scale: torch.Tensor  # float32 (2^(bits-1),) magnitude of each level, ascending; empty for float32 values


CompressedUpdate = dict[str, TensorUpdate]
# what a miner may send of a pseudo-gradient (its differential privacy: clipped and noised), before error feedback
Release = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]


class LevelQuantiser:
    """Sign bit + (bits-1)-bit level; each level decodes at the mean magnitude of its members.

    Levels are assigned on a log grid between the tensor's smallest and largest kept magnitude, and
    the sender transmits the per-level mean magnitudes (a table of 2^(bits-1) float32, ascending).
    Decoding is a table look-up: exact on every machine, and unbiased per level — with 2 bits a
    grid decoded at its end points ({min, max}) is off by a factor of up to √(max/min) on most
    values, the level means are not (docs/codec.md has the measurement)."""

    def __init__(self, bits: int):
        self.bits = bits
        self.levels = 2 ** (bits - 1)

    def assign(self, mag: torch.Tensor) -> torch.Tensor:
        """Level (int64) of each magnitude on the log grid of the non-zero magnitudes."""
        nz = mag[mag > 0]
        if nz.numel() == 0:
            return torch.zeros(mag.shape, dtype=torch.int64)
        lo, hi = nz.min().double().log(), nz.max().double().log()
        step = (hi - lo) / (self.levels - 1)
        if step <= 0:
            return torch.zeros(mag.shape, dtype=torch.int64)
        level = ((mag.double().clamp_min(float(nz.min())).log() - lo) / step).round()
        out: torch.Tensor = level.clamp(0, self.levels - 1).to(torch.int64)
        return out

    def quantise(self, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mag = v.abs().reshape(-1)
        level = self.assign(mag)
        counts = torch.bincount(level, minlength=self.levels).double()
        sums = torch.bincount(level, weights=mag.double(), minlength=self.levels)
        nz = mag[mag > 0]
        if nz.numel() == 0:
            table = torch.zeros(self.levels, dtype=torch.float64)
        else:  # an empty level keeps its grid value, so the table stays ascending
            lo, hi = float(nz.min()), float(nz.max())
            grid = torch.exp(torch.linspace(math.log(lo), math.log(hi), self.levels, dtype=torch.float64))
            table = torch.where(counts > 0, sums / counts.clamp_min(1), grid)
        table = torch.cummax(table.float(), dim=0).values  # float32 rounding must not unsort it
        codes = level.to(torch.uint8) | ((v.reshape(-1) < 0).to(torch.uint8) << (self.bits - 1))
        return codes.reshape(v.shape), table

    def dequantise(self, codes: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        codes = codes.to(torch.int64)
        mag = table.float()[codes & (self.levels - 1)]
        return torch.where((codes >> (self.bits - 1)) & 1 == 1, -mag, mag)

    def check_table(self, table: np.ndarray) -> str | None:
        """Why a received table is not one :meth:`quantise` can produce (None when it is valid)."""
        if not np.isfinite(table).all():
            return "non_finite"
        if (table < 0).any() or (np.diff(table) < 0).any():
            return "bad_encoding"
        if table[0] == 0 and table[-1] != 0:  # all zero (an empty tensor) or all positive
            return "bad_encoding"
        return None


# Under inner steps (the default) honest updates are far less alike than single gradients: recompressed honest mixes
# reached 0.45 (default model), 0.65 (the local-network tests' model) and 0.66 (tiny model), mixers 0.867 at the
# least — where 0.9 missed most of them (docs/scoring.md, "Near-copies").
STEPS_MIX = 0.78
# The raw domain (``dct = False``) under inner steps separates further: honest mixes 0.20 (default model) and 0.28
# (the tests' model) past the first window, mixers 0.71 at the least (docs/scoring.md, "Near-copies").
RAW_STEPS_MIX = 0.5


@dataclass
class DeMoCodec:
    shapes: dict[str, tuple[int, ...]]
    chunk: int = 64
    topk: int = 32
    value_bits: int = 4
    dct: bool = True  # False: top-k of raw parameter-domain chunks (Templar's current codec)
    topk_of: Mapping[str, int] = field(default_factory=dict)  # kind (``parameter_kind``) → its top-k, if not topk
    plans: dict[str, ChunkPlan] = field(init=False)

    def __post_init__(self) -> None:
        if self.value_bits not in (*range(2, 9), 32):
            raise ValueError(f"value_bits must be 2..8 or 32, got {self.value_bits}")
        self.plans = {n: ChunkPlan.for_shape(s, self.chunk, self.dct) for n, s in self.shapes.items()}
        self.quantiser = LevelQuantiser(self.value_bits) if self.value_bits <= 8 else None

    @classmethod
    def from_hparams(cls, shapes: dict[str, tuple[int, ...]], hp: HParams) -> DeMoCodec:
        counts = {"embed": hp.embed_topk, "attn": hp.attn_topk, "ffn": hp.ffn_topk}  # 0: that kind keeps topk
        present = {parameter_kind(n) for n in shapes}
        topk_of = {kind: k for kind, k in counts.items() if k and kind in present}
        return cls(shapes, chunk=hp.chunk, topk=hp.topk, value_bits=hp.value_bits, dct=hp.dct, topk_of=topk_of)

    def k(self, name: str) -> int:
        return min(self.topk_of.get(parameter_kind(name), self.topk), self.plans[name].chunk_size)

    def index_coder(self, name: str) -> EliasFano:
        return EliasFano(self.plans[name].chunk_size, self.k(name))

    def settings(self) -> dict[str, str]:
        """What a receiver must agree on to read an update (goes into payload metadata)."""
        return {"codec": "demo", "chunk": str(self.chunk), "topk": str(self.topk), "value_bits": str(self.value_bits),
                "dct": str(int(self.dct)),
                "topk_of": ",".join(f"{n}={k}" for n, k in sorted(self.topk_of.items())) or "none"}

    def near_copy_thresholds(self, inner_steps: bool) -> NearCopyThresholds:
        """Paper mode's thresholds, with a lower *mix* under inner steps, lower still in the raw domain: honest
        inner-step updates are far less alike than single gradients (docs/scoring.md, "Near-copies")."""
        if not inner_steps:
            return DEFAULT_THRESHOLDS
        return replace(DEFAULT_THRESHOLDS, mix=STEPS_MIX if self.dct else RAW_STEPS_MIX)

    # --------------------------------------------------------- compress
    def compress_tensor(self, name: str, x: torch.Tensor, window: int, uid: int = 0) -> TensorUpdate:
        """Top-k of the chunked DCT of ``x`` (DeMo's transform is the same in every window)."""
        idx, vals = self.select(name, self.plans[name].encode(x.float()))
        codes, scale = self.quantise(vals)
        return TensorUpdate(idx, codes, scale)

    def select(self, name: str, coeffs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(indices, values) of the top-k of every chunk row of ``coeffs`` (n_chunks × chunk_size), on the CPU.
        Each row on its own: any run of whole chunk rows gives those rows' part of the whole tensor's result."""
        idx = coeffs.abs().topk(self.k(name), dim=1, sorted=False).indices.sort(dim=1).values
        return idx.cpu(), coeffs.gather(1, idx).cpu()

    def quantise(self, vals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes, level table) of one tensor's kept values (float32 values and no table with 32-bit values)."""
        if self.quantiser is None:
            return vals.clone(), torch.zeros(0)
        return self.quantiser.quantise(vals)

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
        return unit_vector(self.values(u))

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
    # Three tensors for the whole model (every parameter's part at a fixed offset, in ``shapes``
    # order) instead of three per parameter: the safetensors header of 3·(number of parameters)
    # entries was ~10 KB, a quarter of a 2-bit update.
    def wire_spec(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Exact tensor set of an encoded update: key → (numpy dtype name, shape)."""
        return dict(self._wire_spec)  # a copy: callers may extend it

    @functools.cached_property
    def _layout(self) -> dict[str, tuple[slice, slice, slice]]:
        """name → (its bytes in demo.idx, its entries in demo.val, its entries in demo.scale)."""
        out, i, v, s = {}, 0, 0, 0
        for n, plan in self.plans.items():
            count = plan.n_chunks * self.k(n)
            di = self.index_coder(n).nbytes(plan.n_chunks)
            dv = codes_nbytes(count, self.value_bits) if self.quantiser else count
            ds = self.quantiser.levels if self.quantiser else 0
            out[n] = (slice(i, i + di), slice(v, v + dv), slice(s, s + ds))
            i, v, s = i + di, v + dv, s + ds
        return out

    @functools.cached_property
    def _wire_spec(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        # Fixed by the shapes and settings; gather needs it several times per peer, so build it once.
        last = list(self._layout.values())[-1] if self._layout else (slice(0, 0),) * 3
        n_idx, n_val, n_scale = (part.stop for part in last)
        spec: dict[str, tuple[str, tuple[int, ...]]] = {"demo.idx": ("uint8", (n_idx,)),
                "demo.val": ("uint8", (n_val,)) if self.quantiser else ("float32", (n_val,))}
        if self.quantiser:
            spec["demo.scale"] = ("float32", (n_scale,))
        return spec

    def to_wire(self, update: CompressedUpdate) -> dict[str, np.ndarray]:
        idx, val, scale = [], [], []
        for n in self.plans:
            u = update[n]
            idx.append(self.index_coder(n).pack(u.idx.numpy()))
            if self.quantiser:
                val.append(pack_codes(u.codes.numpy().reshape(-1), self.value_bits))
                scale.append(u.scale.numpy().astype(np.float32).reshape(-1))
            else:
                val.append(u.codes.numpy().reshape(-1).astype(np.float32))
        out = {"demo.idx": np.concatenate(idx) if idx else np.zeros(0, np.uint8),
               "demo.val": np.concatenate(val) if val else np.zeros(0, np.uint8 if self.quantiser else np.float32)}
        if self.quantiser:
            out["demo.scale"] = np.concatenate(scale) if scale else np.zeros(0, np.float32)
        return out

    def from_wire(self, tensors: dict[str, np.ndarray], window: int) -> CompressedUpdate:
        """Inverse of :meth:`to_wire` for tensors already matching :meth:`wire_spec`.

        Raises :class:`PackingError` (reason = a Reason value) on any content violation: index
        streams (count, range, order, padding), level tables (finite, ascending, all > 0 or all 0),
        float32 values (finite)."""
        update: CompressedUpdate = {}
        idx_all, val_all = np.asarray(tensors["demo.idx"]), np.asarray(tensors["demo.val"])
        for n, plan in self.plans.items():
            k, (si, sv, ss) = self.k(n), self._layout[n]
            idx = torch.from_numpy(self.index_coder(n).unpack(idx_all[si], plan.n_chunks))
            if self.quantiser:
                scale = np.asarray(tensors["demo.scale"], dtype=np.float32)[ss]
                bad = self.quantiser.check_table(scale)
                if bad:
                    raise PackingError(bad, f"{n}: level table must be finite and ascending, all > 0 or all 0")
                codes = unpack_codes(val_all[sv], plan.n_chunks * k, self.value_bits)
                update[n] = TensorUpdate(idx, torch.from_numpy(codes.reshape(plan.n_chunks, k)),
                                         torch.from_numpy(scale.copy()))
            else:
                vals = np.asarray(val_all[sv], dtype=np.float32)
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

    def __init__(self, codec: TensorCodec, beta: float, device: str | torch.device = "cpu"):
        self.codec, self.beta = codec, beta
        self.buffers = {n: torch.zeros(s, device=device) for n, s in codec.shapes.items()}

    def step(self, grads: Mapping[str, torch.Tensor], window: int, uid: int = 0,
             release: Release | None = None) -> CompressedUpdate:
        """This window's compressed update; ``release`` (differential privacy) sees the gradient first."""
        if release is not None:
            grads = release(dict(grads))
        update: CompressedUpdate = {}
        for name, e in self.buffers.items():
            e.mul_(self.beta).add_(grads[name].to(e.device, torch.float32))
            u = self.codec.compress_tensor(name, e, window, uid)
            e.sub_(self.codec.to_dense(name, u, e.device))
            update[name] = u
        return update

    def state(self) -> dict[str, torch.Tensor]:
        return buffers_state(self.buffers)

    def load_state(self, tensors: Mapping[str, torch.Tensor]) -> bool:
        """Restore buffers saved by :meth:`state`; returns False (and keeps zeros) on any mismatch."""
        return load_buffers(self.buffers, tensors)


def buffers_state(buffers: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Error-feedback buffers as flat tensors ``ef.<param>`` (one process's, or one rank's slices)."""
    return {f"ef.{n}": b.detach().cpu().contiguous() for n, b in buffers.items()}


def load_buffers(buffers: Mapping[str, torch.Tensor], tensors: Mapping[str, torch.Tensor]) -> bool:
    """Copy :func:`buffers_state` back into ``buffers``; False (and nothing changed) on any mismatch of keys,
    shapes or finiteness."""
    want = {f"ef.{n}": b.shape for n, b in buffers.items()}
    if set(tensors) != set(want) or any(tensors[k].shape != s for k, s in want.items()):
        return False
    if not all(bool(torch.isfinite(t).all()) for t in tensors.values()):
        return False
    for n, b in buffers.items():
        b.copy_(tensors[f"ef.{n}"])
    return True

