"""The "semantic gradient" sketch codec (ZIP-400 §2, ZIP-001): a seeded Johnson–Lindenstrauss
projection per tensor, clipping, optional noise, stochastic quantisation, decode by the transpose.

Projection.  For a tensor of p values (padded with zeros to P = 2^⌈log2 p⌉) the sketch is the
subsampled randomised Hadamard transform (Ailon–Chazelle fast JL)::

    S = sqrt(P/d) · R · H · D        y = S x   (d values, d = min(sketch_dim, P))

D: random ±1 signs, H: orthonormal Walsh–Hadamard, R: d distinct coordinates out of P.  The
matrix is never built or stored: signs and rows are re-derived from (seed, window, tensor name)
with NumPy's PCG64 raw bit stream (stable across versions), H is applied in O(P log P) with
additions only (so every node decodes the same bits).  ‖Sx‖ ≈ ‖x‖ (JL), and S Sᵀ = (P/d)·I, so
the decoder uses the scaled transpose (d/P)·Sᵀ = S⁺, the orthogonal projection onto the sketched
subspace — error feedback then keeps exactly what was not sent.  The subspace rotates every
window (the seed includes the window), so over windows error feedback delivers all directions.

It is a different trade-off from DeMo: decoded cosine to the true update is about sqrt(d/P) per
tensor whatever the gradient looks like (see scripts/benchmarks/sketch.py and docs/extensions.md).
"""
from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from dso.codec.codecs import unit_vector
from dso.codec.packing import PackingError, codes_nbytes, pack_codes, unpack_codes
from dso.protocol.rejections import Reason

if TYPE_CHECKING:
    from dso.config.schema import HParams


@dataclass
class SketchUpdate:
    codes: torch.Tensor  # uint8 (d,) level codes, or float32 (d,) values when bits == 32
    scale: torch.Tensor  # float32 (1,) = s, levels span [-s, s]; empty for float32 values
    window: int = 0      # which projection made it (the subspace rotates per window)


SketchCompressed = dict[str, SketchUpdate]


@dataclass(frozen=True)
class Projection:
    """The expansion of (seed, window, name): O(P) numbers, not a matrix."""

    numel: int
    padded: int
    dim: int
    signs: torch.Tensor  # float32 (P,) of ±1
    rows: torch.Tensor   # int64 (d,) ascending, distinct, < P


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal fast Walsh–Hadamard transform along the last dim (length a power of two).

    Sylvester ordering; H is symmetric and its own inverse."""
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"length {n} is not a power of two")
    lead = x.shape[:-1]
    y = x.reshape(-1, n)
    h = 1
    while h < n:
        y = y.reshape(-1, n // (2 * h), 2, h)
        y = torch.stack((y[:, :, 0] + y[:, :, 1], y[:, :, 0] - y[:, :, 1]), dim=2)
        h *= 2
    return (y.reshape(*lead, n) / math.sqrt(n))


def derive_seed(*words: object) -> int:
    """63-bit seed from labelled words (same on every node and platform)."""
    text = "dso/sketch/v1|" + "|".join(str(w) for w in words)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


class SketchCodec:
    """Same interface as :class:`dso.codec.demo.DeMoCodec` (compress/decode/wire/sizes/mean_delta)."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], dim: int = 4096, clip: float = 1.0, bits: int = 4,
                 seed: int = 0, noise_std: float = 0.0):
        if dim < 1 or not clip > 0 or noise_std < 0 or bits not in (*range(2, 9), 32):
            raise ValueError("sketch codec: dim >= 1, clip > 0, noise_std >= 0, bits in 2..8 or 32")
        self.shapes = {n: tuple(s) for n, s in shapes.items()}
        self.dim, self.clip, self.bits, self.seed = int(dim), float(clip), int(bits), int(seed)
        self.noise_std = float(noise_std)
        self._cache: OrderedDict[tuple[str, int], Projection] = OrderedDict()

    @classmethod
    def from_hparams(cls, shapes: dict[str, tuple[int, ...]], hp: HParams) -> SketchCodec:
        return cls(shapes, dim=hp.sketch_dim, clip=hp.sketch_clip, bits=hp.value_bits, seed=hp.seed)

    def near_copy_thresholds(self, inner_steps: bool) -> None:
        """None: exact copies only.  Every peer's update is projected onto the window's one shared subspace, where
        honest inner-step updates measure alike (honest peers were caught as near-copies)."""
        return None

    def settings(self) -> dict[str, str]:
        return {"codec": "sketch", "sketch_dim": str(self.dim), "sketch_clip": repr(self.clip),
                "value_bits": str(self.bits), "sketch_seed": str(self.seed)}

    def rounding_generator(self, window: int, uid: int, name: str) -> torch.Generator:
        """Stochastic rounding's randomness for one tensor of one sender in one window (reproducible)."""
        return torch.Generator().manual_seed(derive_seed(self.seed, int(window), "rounding", uid, name))

    # --------------------------------------------------------- projection
    @staticmethod
    def padded_size(numel: int) -> int:
        return 1 << max(0, (numel - 1).bit_length())

    def dim_of(self, name: str) -> int:
        return min(self.dim, self.padded_size(math.prod(self.shapes[name])))

    def projection(self, name: str, window: int) -> Projection:
        key = (name, int(window))
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        numel = math.prod(self.shapes[name])
        padded, dim = self.padded_size(numel), self.dim_of(name)
        raw = np.random.PCG64(derive_seed(self.seed, int(window), name)).random_raw(2 * padded)
        signs = torch.from_numpy(1.0 - 2.0 * (raw[:padded] & 1).astype(np.float32))
        # d smallest of P random 64-bit keys: a uniform d-subset (stable sort breaks any tie by index)
        rows = np.sort(np.argsort(raw[padded:], kind="stable")[:dim])
        proj = Projection(numel, padded, dim, signs, torch.from_numpy(rows.astype(np.int64)))
        self._cache[key] = proj
        while len(self._cache) > 2 * max(1, len(self.shapes)):  # current + previous window
            self._cache.popitem(last=False)
        return proj

    def project(self, name: str, x: torch.Tensor, window: int) -> torch.Tensor:
        """y = S x (float32, length d) for a tensor of the named shape."""
        p = self.projection(name, window)
        flat = x.detach().to("cpu", torch.float32).reshape(-1)
        padded = torch.nn.functional.pad(flat, (0, p.padded - p.numel)) * p.signs
        return fwht(padded)[p.rows] * math.sqrt(p.padded / p.dim)

    def transpose(self, name: str, y: torch.Tensor, window: int, device: str | torch.device = "cpu") -> torch.Tensor:
        """x̂ = (d/P)·Sᵀ y = S⁺ y: the least-norm tensor whose sketch is y."""
        p = self.projection(name, window)
        z = torch.zeros(p.padded, dtype=torch.float32)
        z[p.rows] = y.detach().to("cpu", torch.float32) * math.sqrt(p.dim / p.padded)
        x = fwht(z) * p.signs
        return x[: p.numel].reshape(self.shapes[name]).to(device)

    # ----------------------------------------------------------- compress
    def compress_tensor(self, name: str, x: torch.Tensor, window: int, uid: int = 0,
                        generator: torch.Generator | None = None) -> SketchUpdate:
        """Project with the window's projection, clip to L2 ≤ clip, add N(0, noise_std²) per value,
        quantise stochastically.  Randomness comes from ``generator``, else from (seed, window, uid, name)."""
        gen = self.rounding_generator(window, uid, name) if generator is None else generator
        y = self.project(name, x, window)
        norm = float(torch.linalg.vector_norm(y))
        if not math.isfinite(norm):
            raise ValueError(f"{name}: update holds NaN or ±inf")
        if norm > self.clip:
            y = y * (self.clip / norm)
        if self.noise_std > 0:
            y = y + torch.randn(y.shape, generator=gen) * self.noise_std
        if self.bits == 32:
            return SketchUpdate(y.float().clone(), torch.zeros(0), int(window))
        codes, scale = stochastic_quantise(y, self.bits, gen)
        return SketchUpdate(codes, scale, int(window))

    def compress(self, tensors: Mapping[str, torch.Tensor], window: int, uid: int = 0,
                 generator: torch.Generator | None = None) -> SketchCompressed:
        return {n: self.compress_tensor(n, t, window, uid, generator) for n, t in tensors.items()}

    # --------------------------------------------------------- decompress
    def values(self, u: SketchUpdate) -> torch.Tensor:
        """The sketch values y (float32, length d)."""
        if self.bits == 32:
            return u.codes.float()
        return dequantise(u.codes, u.scale, self.bits)

    def normalised_values(self, u: SketchUpdate) -> torch.Tensor | None:
        return unit_vector(self.values(u))

    def to_dense(self, name: str, u: SketchUpdate, device: str | torch.device = "cpu") -> torch.Tensor:
        return self.transpose(name, self.values(u), u.window, device)

    def decompress(self, update: SketchCompressed, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        return {n: self.to_dense(n, u, device) for n, u in update.items()}

    def mean_delta(self, updates: list[SketchCompressed],
                   device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        """Decoded mean of per-tensor L2-normalised sketches (decode is linear: sum, then decode once
        per window)."""
        out: dict[str, torch.Tensor] = {}
        for name in self.shapes:
            sums: dict[int, torch.Tensor] = {}
            for update in updates:
                vals = self.normalised_values(update[name])
                if vals is not None:
                    w = update[name].window
                    sums[w] = sums.get(w, torch.zeros(self.dim_of(name))) + vals
            dense = torch.zeros(self.shapes[name], device=device)
            for w in sorted(sums):
                dense += self.transpose(name, sums[w] / len(updates), w, device)
            out[name] = dense
        return out

    # --------------------------------------------------------------- wire
    def wire_spec(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        spec: dict[str, tuple[str, tuple[int, ...]]] = {}
        for n in self.shapes:
            d = self.dim_of(n)
            if self.bits == 32:
                spec[f"{n}.val"] = ("float32", (d,))
            else:
                spec[f"{n}.val"] = ("uint8", (codes_nbytes(d, self.bits),))
                spec[f"{n}.scale"] = ("float32", (1,))
        return spec

    def to_wire(self, update: SketchCompressed) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for n, u in update.items():
            if self.bits == 32:
                out[f"{n}.val"] = u.codes.numpy().astype(np.float32).reshape(-1)
            else:
                out[f"{n}.val"] = pack_codes(u.codes.numpy().reshape(-1), self.bits)
                out[f"{n}.scale"] = u.scale.numpy().astype(np.float32).reshape(1)
        return out

    def from_wire(self, tensors: dict[str, np.ndarray], window: int) -> SketchCompressed:
        """Inverse of :meth:`to_wire` for tensors already matching :meth:`wire_spec`; the updates are
        stamped with ``window`` (the projection that made them).

        Raises :class:`PackingError` (reason = a Reason value) on any content violation."""
        window = int(window)
        update: SketchCompressed = {}
        for n in self.shapes:
            d = self.dim_of(n)
            if self.bits == 32:
                vals = np.asarray(tensors[f"{n}.val"], dtype=np.float32).reshape(-1)
                if vals.size != d:
                    raise PackingError(Reason.BAD_SHAPE.value, f"{n}: {vals.size} values, expected {d}")
                if not np.isfinite(vals).all():
                    raise PackingError(Reason.NON_FINITE.value, f"{n}: non-finite value")
                update[n] = SketchUpdate(torch.from_numpy(vals.copy()), torch.zeros(0), window)
                continue
            scale = np.asarray(tensors[f"{n}.scale"], dtype=np.float32).reshape(-1)
            if scale.size != 1:
                raise PackingError(Reason.BAD_SHAPE.value, f"{n}: scale must hold one value")
            if not np.isfinite(scale).all():
                raise PackingError(Reason.NON_FINITE.value, f"{n}: non-finite scale")
            if scale[0] < 0:
                raise PackingError(Reason.BAD_ENCODING.value, f"{n}: negative scale")
            codes = unpack_codes(tensors[f"{n}.val"], d, self.bits)
            if scale[0] == 0 and codes.any():
                raise PackingError(Reason.BAD_ENCODING.value, f"{n}: zero scale with non-zero codes")
            update[n] = SketchUpdate(torch.from_numpy(codes.copy()), torch.from_numpy(scale.copy()), window)
        return update

    # -------------------------------------------------------------- sizes
    def kept(self) -> int:
        return sum(self.dim_of(n) for n in self.shapes)

    def payload_bytes(self) -> int:
        return sum(math.prod(shape) * np.dtype(dtype).itemsize for dtype, shape in self.wire_spec().values())


# ------------------------------------------------------------ quantiser
def stochastic_quantise(y: torch.Tensor, bits: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Unbiased stochastic rounding onto 2^bits uniform levels spanning [−s, s], s = max|y|.

    Returns (uint8 codes, float32 (1,) scale); a zero vector gives zero codes and s = 0."""
    levels = (1 << bits) - 1
    s = float(y.abs().max()) if y.numel() else 0.0
    if s == 0.0:
        return torch.zeros(y.shape, dtype=torch.uint8), torch.zeros(1)
    t = ((y.double() + s) / (2 * s) * levels).clamp(0, levels)
    low = t.floor()
    up = torch.rand(y.shape, generator=generator, dtype=torch.float64) < (t - low)
    codes = (low + up.double()).clamp(0, levels).to(torch.uint8)
    return codes, torch.tensor([s], dtype=torch.float32)


def dequantise(codes: torch.Tensor, scale: torch.Tensor, bits: int) -> torch.Tensor:
    levels = (1 << bits) - 1
    s = float(scale[0]) if scale.numel() else 0.0
    if s == 0.0:
        return torch.zeros(codes.shape)
    return (codes.to(torch.float64) * (2 * s / levels) - s).float()
