"""The per-window aggregate, published for catch-up: sign(Δ) of every parameter, 2 bits each.

Object ``aggregate/{window}-v{v}.safetensors``: one uint8 tensor per parameter
holding ``pack_codes(sign + 1, bits=2)`` (codes 0, 1, 2 = −1, 0, +1; code 3 is
invalid), metadata ``format``, ``protocol_version``, ``window``,
``model_hash_before``, ``model_hash_after``, ``learning_rate`` (``repr`` of the
float, exact round trip) and ``hparams``.  A node that is behind replays
``θ ← θ·(1 − α·wd) − α·sign`` window by window and can check both hashes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import safetensors.numpy
import torch

from dso.aggregation import signed_step
from dso.model import model_hash
from dso.packing import PackingError, codes_nbytes, pack_codes, unpack_codes
from dso.rejections import Reason, Rejection
from storage import keys
from storage.client import S3Client, StorageError
from storage.jsonobj import rejection_for
from storage.tensorfile import check_spec, header_allowance, load_arrays, parse_uint, read_capped

FORMAT = "dso-aggregate"
BITS = 2
_HEX = set("0123456789abcdef")


@dataclass
class Aggregate:
    window: int
    model_hash_before: str
    model_hash_after: str
    learning_rate: float
    signs: dict[str, torch.Tensor]  # float32 in {-1, 0, +1}, parameter shapes


def aggregate_spec(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {n: ("uint8", (codes_nbytes(math.prod(s), BITS),)) for n, s in shapes.items()}


def aggregate_size_cap(shapes: dict[str, tuple[int, ...]]) -> int:
    return 8 + header_allowance(len(shapes)) + sum(s[0] for _, s in aggregate_spec(shapes).values())


def encode_aggregate(signs: dict[str, torch.Tensor], window: int, model_hash_before: str, model_hash_after: str,
                     learning_rate: float, protocol_version: int, hparams_digest: str) -> bytes:
    tensors = {}
    for name, s in signs.items():
        flat = s.detach().to("cpu").reshape(-1)
        if not bool(((flat == -1) | (flat == 0) | (flat == 1)).all()):
            raise ValueError(f"aggregate {name}: values must be -1, 0 or +1")
        tensors[name] = pack_codes((flat.to(torch.int64) + 1).to(torch.uint8).numpy(), BITS)
    if not math.isfinite(learning_rate) or learning_rate < 0:
        raise ValueError("learning_rate must be finite and >= 0")
    metadata = {"format": FORMAT, "protocol_version": str(protocol_version), "window": str(window),
                "model_hash_before": model_hash_before, "model_hash_after": model_hash_after,
                "learning_rate": repr(float(learning_rate)), "hparams": hparams_digest}
    return safetensors.numpy.save(tensors, metadata=metadata)


def decode_aggregate(data: bytes, shapes: dict[str, tuple[int, ...]], protocol_version: int,
                     expect_window: int | None = None, hparams_digest: str | None = None) -> Aggregate | Rejection:
    """Strictly validate an aggregate against the model's ``shapes``; never raises."""
    try:
        return _decode(data, shapes, protocol_version, expect_window, hparams_digest)
    except Exception as e:  # noqa: BLE001
        return Rejection(Reason.MALFORMED, f"unexpected {type(e).__name__}: {str(e)[:120]}")


def _decode(data, shapes, protocol_version, expect_window, hparams_digest):
    header = read_capped(data, aggregate_size_cap(shapes), len(shapes), {
        "format", "protocol_version", "window", "model_hash_before", "model_hash_after", "learning_rate", "hparams"})
    if isinstance(header, Rejection):
        return header
    md = header.metadata
    checks = [("format", md["format"], FORMAT), ("protocol_version", md["protocol_version"], str(protocol_version))]
    if expect_window is not None:
        checks.append(("window", md["window"], str(expect_window)))
    if hparams_digest is not None:
        checks.append(("hparams", md["hparams"], hparams_digest))
    for name, got, wanted in checks:
        if got != wanted:
            return Rejection(Reason.METADATA_MISMATCH, f"{name}: got {got[:64]!r}, expected {wanted[:64]!r}")
    window = parse_uint(md["window"])
    try:
        lr = float(md["learning_rate"]) if len(md["learning_rate"]) <= 32 else float("nan")
    except ValueError:
        lr = float("nan")
    if window is None or not math.isfinite(lr) or lr < 0:
        return Rejection(Reason.METADATA_MISMATCH, "window or learning_rate unparsable")
    for k in ("model_hash_before", "model_hash_after"):
        if len(md[k]) != 64 or not set(md[k]) <= _HEX:
            return Rejection(Reason.METADATA_MISMATCH, f"{k} is not a sha256 hex digest")
    bad = check_spec(header, aggregate_spec(shapes))
    if bad:
        return bad
    arrays = load_arrays(data)
    if isinstance(arrays, Rejection):
        return arrays
    signs = {}
    for name, shape in shapes.items():
        try:
            codes = unpack_codes(arrays[name], math.prod(shape), BITS)
        except PackingError as e:
            return Rejection(Reason.BAD_ENCODING, f"{name}: {e}")
        if (codes > 2).any():
            return Rejection(Reason.BAD_ENCODING, f"{name}: sign code 3 is not defined")
        signs[name] = torch.from_numpy(codes.astype(np.float32) - 1.0).reshape(shape)
    return Aggregate(window, md["model_hash_before"], md["model_hash_after"], lr, signs)


def apply_aggregate(model: torch.nn.Module, agg: Aggregate, weight_decay: float = 0.0) -> Rejection | None:
    """Replay one window: requires the model to be at ``model_hash_before``; checks ``model_hash_after``.
    On an after-hash mismatch the model has been changed and should be reloaded from a checkpoint."""
    before = model_hash(model)
    if before != agg.model_hash_before:
        return Rejection(Reason.METADATA_MISMATCH, f"window {agg.window}: model is not at model_hash_before")
    signed_step(model, agg.signs, agg.learning_rate, weight_decay)
    if model_hash(model) != agg.model_hash_after:
        return Rejection(Reason.METADATA_MISMATCH, f"window {agg.window}: replay did not reach model_hash_after")
    return None


def put_aggregate(client: S3Client, bucket: str, data: bytes, window: int, protocol_version: int) -> str:
    key = keys.aggregate(window, protocol_version)
    client.put(bucket, key, data)
    return key


def get_aggregate(client: S3Client, bucket: str, window: int, shapes: dict[str, tuple[int, ...]], hp
                  ) -> Aggregate | Rejection:
    cap = aggregate_size_cap(shapes)
    try:
        data = client.get(bucket, keys.aggregate(window, hp.protocol_version), max_bytes=cap)
    except StorageError as e:
        return rejection_for(e)
    return decode_aggregate(data, shapes, hp.protocol_version, window, hp.digest())
