"""The manifest of a sharded checkpoint: which shard object holds which rows of which tensor, and its hash.

A checkpoint's tensors — the parameters in model order, then the outer state (``outer.steps``, and
``outer.momentum.<param>`` for a rule that keeps momentum) — are laid end to end and cut into shards of at most
``shard_bytes``: a shard holds whole tensors, or a run of whole rows (dim 0) of one large tensor.  The
manifest lists, for every shard, its key, its size, its sha256, and its pieces ``[name, first row, end
row]``.  It is another party's JSON when read: every field is checked, the keys are the ones
:func:`storage.keys.checkpoint_shard` builds for the window (never a key it names), and the pieces must
tile every expected tensor exactly, in order — whatever shard sizes the writer chose.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dso.protocol.rejections import Reason, Rejection
from dso.training.outer import OuterState
from dso.training.outer_rules import OuterRule
from storage import keys

FORMAT = "dso-checkpoint-sharded"
MAX_SHARDS = 4096
MANIFEST_MAX_BYTES = 4 * 1024 * 1024
SHARD_HEADER_ALLOWANCE = 4096  # bytes of safetensors header and metadata each shard may add to the total
ITEMSIZE = {"float32": 4, "int64": 8}


@dataclass(frozen=True)
class Piece:
    name: str
    start: int   # first row (dim 0) of the tensor in this shard
    end: int     # one past the last


@dataclass(frozen=True)
class Shard:
    key: str
    size: int
    sha256: str
    pieces: tuple[Piece, ...]


@dataclass(frozen=True)
class Manifest:
    window: int
    model_hash: str
    outer_digest: str
    data_hash: str
    hparams: str
    shards: tuple[Shard, ...]


Entry = tuple[str, str, tuple[int, ...]]  # name, numpy dtype, shape


def expected_tensors(shapes: Mapping[str, tuple[int, ...]], rule: OuterRule) -> list[Entry]:
    """Every tensor of a checkpoint in file order: the parameters (float32), then the outer state of ``rule``."""
    out: list[Entry] = [(n, "float32", tuple(s)) for n, s in shapes.items()]
    out += [(k, dtype, shape) for k, (dtype, shape) in OuterState.fresh(shapes, rule).spec().items()]
    return out


def row_bytes(dtype: str, shape: tuple[int, ...]) -> int:
    return ITEMSIZE[dtype] * math.prod(shape[1:])


def plan_shards(entries: Sequence[Entry], shard_bytes: int) -> list[list[Piece]]:
    """Cut the tensors, end to end, into shards of at most ``shard_bytes`` (a row larger than that: one row)."""
    shards: list[list[Piece]] = []
    current: list[Piece] = []
    used = 0
    for name, dtype, shape in entries:
        rows, per_row, row = shape[0] if shape else 1, row_bytes(dtype, shape), 0
        while row < rows:
            fit = (shard_bytes - used) // per_row
            if fit == 0 and current:  # this shard is full: the next one
                shards.append(current)
                current, used = [], 0
                continue
            take = min(rows - row, max(1, fit))
            current.append(Piece(name, row, row + take))
            row, used = row + take, used + take * per_row
    if current:
        shards.append(current)
    return shards


def encode_manifest(manifest: Manifest, protocol_version: int) -> dict[str, Any]:
    return {"format": FORMAT, "protocol_version": protocol_version, "window": manifest.window,
            "model_hash": manifest.model_hash, "outer_digest": manifest.outer_digest,
            "data_hash": manifest.data_hash, "hparams": manifest.hparams,
            "shards": [{"key": s.key, "size": s.size, "sha256": s.sha256,
                        "pieces": [[p.name, p.start, p.end] for p in s.pieces]} for s in manifest.shards]}


def _nat(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _hex64(x: object) -> bool:
    return isinstance(x, str) and len(x) == 64 and all(c in "0123456789abcdef" for c in x)


def parse_manifest(obj: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], rule: OuterRule,
                   protocol_version: int, window: int, run: str, size_cap: int,
                   hparams_digest: str | None = None) -> Manifest | Rejection:
    """A manifest read from S3, checked against the model, the run's rule, the window and the run."""
    fields = {"format", "protocol_version", "window", "model_hash", "outer_digest", "data_hash", "hparams", "shards"}
    if set(obj) != fields:
        return Rejection(Reason.MALFORMED, f"checkpoint manifest keys {sorted(obj)[:9]}")
    if obj["format"] != FORMAT or obj["protocol_version"] != protocol_version or obj["window"] != window:
        return Rejection(Reason.METADATA_MISMATCH, "checkpoint manifest: format, protocol version or window")
    if hparams_digest is not None and obj["hparams"] != hparams_digest:
        return Rejection(Reason.METADATA_MISMATCH, f"checkpoint hparams {str(obj['hparams'])[:32]!r}")
    if not (_hex64(obj["model_hash"]) and _hex64(obj["outer_digest"]) and isinstance(obj["data_hash"], str)
            and isinstance(obj["hparams"], str) and len(obj["data_hash"]) <= 128 and len(obj["hparams"]) <= 128):
        return Rejection(Reason.MALFORMED, "checkpoint manifest: hashes must be sha256 hex digests")
    raw = obj["shards"]
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_SHARDS:
        return Rejection(Reason.MALFORMED, f"checkpoint manifest: 1 to {MAX_SHARDS} shards")
    shards = []
    for i, item in enumerate(raw):
        shard = _shard(item, i, window, protocol_version, run)
        if isinstance(shard, Rejection):
            return shard
        shards.append(shard)
    cap = size_cap + SHARD_HEADER_ALLOWANCE * len(shards)  # each shard repeats a header
    if sum(s.size for s in shards) > cap:
        return Rejection(Reason.TOO_LARGE, f"checkpoint shards total more than the cap {cap}")
    bad = check_tiling([p for s in shards for p in s.pieces], expected_tensors(shapes, rule))
    if bad:
        return Rejection(Reason.BAD_KEYS, f"checkpoint manifest: {bad}")
    return Manifest(window, obj["model_hash"], obj["outer_digest"], obj["data_hash"], obj["hparams"], tuple(shards))


def _shard(item: object, index: int, window: int, protocol_version: int, run: str) -> Shard | Rejection:
    if not isinstance(item, dict) or set(item) != {"key", "size", "sha256", "pieces"}:
        return Rejection(Reason.MALFORMED, f"checkpoint shard {index}: keys")
    if item["key"] != keys.checkpoint_shard(window, index, protocol_version, run):
        return Rejection(Reason.MALFORMED, f"checkpoint shard {index}: key does not match its window and index")
    if not (_nat(item["size"]) and _hex64(item["sha256"]) and isinstance(item["pieces"], list)):
        return Rejection(Reason.MALFORMED, f"checkpoint shard {index}: size, sha256 or pieces")
    pieces = []
    for p in item["pieces"]:
        if not (isinstance(p, list) and len(p) == 3 and isinstance(p[0], str) and _nat(p[1]) and _nat(p[2])
                and p[1] < p[2]):
            return Rejection(Reason.MALFORMED, f"checkpoint shard {index}: a piece is not [name, start, end]")
        pieces.append(Piece(p[0], p[1], p[2]))
    if not pieces or len({p.name for p in pieces}) != len(pieces):
        return Rejection(Reason.MALFORMED, f"checkpoint shard {index}: no pieces, or one tensor twice")
    return Shard(item["key"], item["size"], item["sha256"], tuple(pieces))


def check_tiling(pieces: Sequence[Piece], entries: Sequence[Entry]) -> str | None:
    """Why ``pieces`` (in shard order) do not cover every expected tensor's rows exactly once, in order."""
    at = 0
    for name, _, shape in entries:
        rows, row = shape[0] if shape else 1, 0
        while row < rows:
            if at >= len(pieces):
                return f"{name[:64]} rows {row}.. missing"
            p = pieces[at]
            if p.name != name or p.start != row or p.end > rows:
                return f"piece {at} is {p.name[:64]}[{p.start}:{p.end}], expected {name[:64]} from row {row}"
            row, at = p.end, at + 1
    return None if at == len(pieces) else f"{len(pieces) - at} pieces beyond the model's tensors"
