"""Strict reading of safetensors bytes written by someone we do not trust.

The container is: 8-byte little-endian header length ``n``, ``n`` bytes of
JSON header (tensor name → dtype, shape, byte range; optional
``__metadata__`` of string → string), then the raw tensor bytes.  We check
the header ourselves — bounded length, valid UTF-8 JSON without duplicate keys,
known dtypes, sizes that match shapes, byte ranges that tile the data exactly —
so the expected tensor set and the caller's spec can be compared *before*
anything is materialised; only then does ``safetensors.numpy.load`` read the
arrays.  No pickle, no ``torch.load``.  Every failure is a Rejection.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, NoReturn, TypeGuard

import numpy as np
import safetensors.numpy

from dso.protocol.rejections import Reason, Rejection

ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
            "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
NUMPY_TO_ST = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16", "float16": "F16",
               "int32": "I32", "uint32": "U32", "float32": "F32", "int64": "I64", "uint64": "U64",
               "float64": "F64"}
MAX_NAME = 512
MAX_RANK = 8

Spec = dict[str, tuple[str, tuple[int, ...]]]  # key → (numpy dtype name, shape)


@dataclass(frozen=True)
class Entry:
    dtype: str                 # safetensors code, e.g. "F32"
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    metadata: dict[str, str]
    entries: dict[str, Entry]
    data_start: int            # offset of the tensor bytes in the file


def _malformed(detail: str) -> Rejection:
    return Rejection(Reason.MALFORMED, detail)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k[:64]!r}")
        out[k] = v
    return out


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def strict_json(text: str) -> Any:  # any JSON value
    """json.loads that refuses duplicate keys and NaN/Infinity (raises ValueError/RecursionError)."""
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)


def _is_nat(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def read_header(data: bytes, max_header_bytes: int) -> Header | Rejection:
    if len(data) < 8:
        return _malformed(f"{len(data)} bytes: too short for a safetensors file")
    n = int.from_bytes(data[:8], "little")
    if n < 2 or n > max_header_bytes:
        return _malformed(f"header length {n} outside [2, {max_header_bytes}]")
    if 8 + n > len(data):
        return _malformed(f"header length {n} runs past the end of the {len(data)}-byte file")
    try:
        raw = strict_json(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        return _malformed(f"header is not valid JSON ({str(e)[:120]})")
    if not isinstance(raw, dict):
        return _malformed("header is not a JSON object")
    metadata = raw.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        return _malformed("__metadata__ must map strings to strings")
    entries: dict[str, Entry] = {}
    for name, item in raw.items():
        if len(name) > MAX_NAME:
            return _malformed(f"tensor name of {len(name)} characters")
        if not isinstance(item, dict) or set(item) != {"dtype", "shape", "data_offsets"}:
            return _malformed(f"{name[:64]}: entry must have exactly dtype, shape, data_offsets")
        dtype, shape, offsets = item["dtype"], item["shape"], item["data_offsets"]
        if dtype not in ITEMSIZE:
            return _malformed(f"{name[:64]}: unknown dtype {str(dtype)[:16]!r}")
        if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(_is_nat(d) for d in shape):
            return _malformed(f"{name[:64]}: shape must be a list of at most {MAX_RANK} non-negative ints")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_nat(o) for o in offsets)
                and offsets[0] <= offsets[1]):
            return _malformed(f"{name[:64]}: data_offsets must be [begin, end] with 0 <= begin <= end")
        if offsets[1] - offsets[0] != math.prod(shape) * ITEMSIZE[dtype]:
            return _malformed(f"{name[:64]}: byte range does not match shape {shape} of {dtype}")
        entries[name] = Entry(dtype, tuple(shape), offsets[0], offsets[1])
    # byte ranges must tile the data section exactly: no gaps, overlaps or trailing bytes
    cursor = 0
    for entry in sorted(entries.values(), key=lambda x: (x.begin, x.end)):
        if entry.begin != cursor:
            return _malformed(f"tensor byte ranges leave a gap or overlap at offset {cursor}")
        cursor = entry.end
    if cursor != len(data) - 8 - n:
        return _malformed(f"tensor bytes cover {cursor} of {len(data) - 8 - n} data bytes")
    return Header(metadata, entries, 8 + n)


def check_spec(header: Header, spec: Spec) -> Rejection | None:
    """Exact key set, then dtype and shape of every tensor."""
    missing = sorted(set(spec) - set(header.entries))
    extra = sorted(set(header.entries) - set(spec))
    if missing or extra:
        def show(keys: list[str]) -> str:
            return ", ".join(k[:48] for k in keys[:4]) + (f" (+{len(keys) - 4})" if len(keys) > 4 else "")
        parts = ([f"missing {show(missing)}"] if missing else []) + ([f"extra {show(extra)}"] if extra else [])
        return Rejection(Reason.BAD_KEYS, "; ".join(parts))
    for key, (dtype, shape) in spec.items():
        entry = header.entries[key]
        if entry.dtype != NUMPY_TO_ST[dtype]:
            return Rejection(Reason.BAD_DTYPE, f"{key}: {entry.dtype}, expected {NUMPY_TO_ST[dtype]}")
        if entry.shape != tuple(shape):
            return Rejection(Reason.BAD_SHAPE, f"{key}: shape {list(entry.shape)}, expected {list(shape)}")
    return None


def load_arrays(data: bytes) -> dict[str, np.ndarray] | Rejection:
    try:
        return safetensors.numpy.load(data)
    except Exception as e:  # noqa: BLE001 — the library's own checks: still a format rejection
        return _malformed(f"safetensors refused the file ({str(e)[:120]})")


def header_allowance(n_tensors: int) -> int:
    """Generous upper bound on the JSON header of a file with ``n_tensors`` of our own naming."""
    return 4096 + 256 * n_tensors


def parse_uint(text: str, limit: int = 2 ** 63) -> int | None:
    """Canonical decimal (no sign, no leading zeros) → int below ``limit``, else None."""
    if not isinstance(text, str) or not text.isascii() or not text.isdigit() or len(text) > 19:
        return None
    if len(text) > 1 and text[0] == "0":
        return None
    value = int(text)
    return value if value < limit else None


def read_capped(data: bytes, cap: int, n_tensors: int, metadata_keys: set[str] | None = None) -> Header | Rejection:
    """The checks every one of our safetensors objects starts with: size cap, strict header, and (when
    given) exactly these metadata keys."""
    if len(data) > cap:
        return Rejection(Reason.TOO_LARGE, f"{len(data)} bytes, cap {cap}")
    header = read_header(data, header_allowance(n_tensors))
    if isinstance(header, Rejection) or metadata_keys is None:
        return header
    if set(header.metadata) != metadata_keys:
        return Rejection(Reason.METADATA_MISMATCH, f"metadata keys {sorted(header.metadata)[:8]}")
    return header

