"""Compact, canonical bit encodings of a compressed update (pure numpy).

* Indices: the k positions kept in a chunk of size U are sorted and written
  with Elias–Fano coding — ``k·L`` low bits plus ``k + (U-1 >> L)`` upper bits,
  ``L = floor(log2(U/k))`` — a fixed length per chunk within about one bit per
  index of the information bound ``log2 C(U, k) / k``.
* Values: ``b`` bits each — a sign bit and ``b-1`` bits of level on a
  logarithmic grid between the smallest and largest kept magnitude of the tensor.

Every decoder checks what it reads (lengths, counts per chunk, index range,
ordering, zero padding) and raises :class:`PackingError` with the reason.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


class PackingError(ValueError):
    """Packed bytes that are not a canonical encoding; ``reason`` is a :class:`dso.protocol.rejections.Reason` value."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class EliasFano:
    universe: int
    k: int

    @property
    def low_bits(self) -> int:
        return max(0, int(math.floor(math.log2(self.universe / self.k)))) if self.k else 0

    @property
    def upper_bits(self) -> int:
        return self.k + ((self.universe - 1) >> self.low_bits)

    @property
    def bits_per_chunk(self) -> int:
        return self.k * self.low_bits + self.upper_bits

    def nbytes(self, n_chunks: int) -> int:
        return -(-n_chunks * self.bits_per_chunk // 8)

    def pack(self, idx: np.ndarray) -> np.ndarray:
        """(n, k) ascending indices per row → uint8 bit stream."""
        idx = np.asarray(idx, dtype=np.int64)
        n, k, L = idx.shape[0], self.k, self.low_bits
        low = (idx[:, :, None] >> np.arange(L)) & 1                      # (n, k, L), LSB first
        upper = np.zeros((n, self.upper_bits), dtype=np.uint8)
        upper[np.arange(n)[:, None], (idx >> L) + np.arange(k)] = 1
        bits = np.concatenate([low.reshape(n, k * L).astype(np.uint8), upper], axis=1)
        return np.packbits(bits.reshape(-1), bitorder="little")

    def unpack(self, buf: np.ndarray, n_chunks: int) -> np.ndarray:
        buf = np.asarray(buf, dtype=np.uint8).reshape(-1)
        if buf.size != self.nbytes(n_chunks):
            raise PackingError("bad_shape", f"index stream has {buf.size} bytes, expected {self.nbytes(n_chunks)}")
        total = n_chunks * self.bits_per_chunk
        bits: np.ndarray = np.unpackbits(buf, bitorder="little")
        if bits[total:].any():
            raise PackingError("bad_encoding", "non-zero padding bits after the index stream")
        bits = bits[:total].reshape(n_chunks, self.bits_per_chunk)
        k, L = self.k, self.low_bits
        upper = bits[:, k * L:]
        counts = upper.sum(axis=1, dtype=np.int64)
        if (counts != k).any():
            bad = int(np.flatnonzero(counts != k)[0])
            raise PackingError("wrong_count", f"chunk {bad} encodes {counts[bad]} indices, expected {k}")
        pos = np.nonzero(upper)[1].reshape(n_chunks, k)
        high = pos - np.arange(k)
        low = (bits[:, : k * L].reshape(n_chunks, k, L).astype(np.int64) << np.arange(L)).sum(axis=2)
        idx: np.ndarray = (high << L) | low
        if (idx >= self.universe).any():
            raise PackingError("index_out_of_range", f"an index is >= chunk size {self.universe}")
        if k > 1 and (np.diff(idx, axis=1) <= 0).any():
            raise PackingError("bad_encoding", "indices within a chunk are not strictly increasing")
        return idx


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes < 2**bits → packed bit stream."""
    codes = np.asarray(codes, dtype=np.uint8).reshape(-1)
    expanded = (codes[:, None] >> np.arange(bits, dtype=np.uint8)) & 1
    return np.packbits(expanded.reshape(-1), bitorder="little")


def codes_nbytes(count: int, bits: int) -> int:
    return -(-count * bits // 8)


def unpack_codes(buf: np.ndarray, count: int, bits: int) -> np.ndarray:
    buf = np.asarray(buf, dtype=np.uint8).reshape(-1)
    if buf.size != codes_nbytes(count, bits):
        raise PackingError("bad_shape", f"value stream has {buf.size} bytes, expected {codes_nbytes(count, bits)}")
    flat = np.unpackbits(buf, bitorder="little")
    if flat[count * bits:].any():
        raise PackingError("bad_encoding", "non-zero padding bits after the value stream")
    expanded = flat[: count * bits].reshape(count, bits)
    codes: np.ndarray = (expanded << np.arange(bits, dtype=np.uint8)).sum(axis=1, dtype=np.uint8)
    return codes


def index_bound_bits(universe: int, k: int) -> float:
    """Information bound on bits per index: log2 C(universe, k) / k."""
    return (math.lgamma(universe + 1) - math.lgamma(k + 1) - math.lgamma(universe - k + 1)) / math.log(2) / k
