"""Small JSON objects in S3 (peers lists, pointers, ledger records, commits), read strictly.

Reading another party's JSON: size cap before and during download, UTF-8,
no duplicate keys, no NaN/Infinity, bounded nesting, top level must be an
object.  Failures are Rejections; S3 failures map to the shared reasons.
"""
from __future__ import annotations

import json
from typing import Any

from dso.protocol.rejections import Reason, Rejection, unexpected
from storage.client import ObjectReader, S3Client, StorageError
from storage.tensorfile import strict_json

MAX_JSON_BYTES = 64 * 1024
MAX_DEPTH = 16

_KIND_TO_REASON = {"missing": Reason.MISSING, "denied": Reason.UNREACHABLE, "unavailable": Reason.UNREACHABLE,
                   "timeout": Reason.TIMEOUT, "too_large": Reason.TOO_LARGE,
                   "refused": Reason.BAD_COMMITMENT}  # the commitment names an endpoint outside the policy


def rejection_for(e: StorageError) -> Rejection:
    """The shared rejection reason for an S3 failure."""
    return Rejection(_KIND_TO_REASON.get(e.kind, Reason.UNREACHABLE), str(e)[:200])


def _depth(obj: object, level: int = 0) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(obj, dict):
        return max((_depth(v, level + 1) for v in obj.values()), default=level)
    if isinstance(obj, list):
        return max((_depth(v, level + 1) for v in obj), default=level)
    return level


def parse_json_object(data: bytes, max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any] | Rejection:
    if len(data) > max_bytes:
        return Rejection(Reason.TOO_LARGE, f"{len(data)} bytes, cap {max_bytes}")
    try:
        obj = strict_json(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        return Rejection(Reason.MALFORMED, f"not valid JSON ({str(e)[:120]})")
    if not isinstance(obj, dict):
        return Rejection(Reason.MALFORMED, "top level is not a JSON object")
    if _depth(obj) > MAX_DEPTH:
        return Rejection(Reason.MALFORMED, f"nested deeper than {MAX_DEPTH}")
    return obj


def encode_json(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def put_json(client: S3Client, bucket: str, key: str, obj: dict[str, Any]) -> None:
    client.put(bucket, key, encode_json(obj), content_type="application/json")


def get_json(client: ObjectReader, bucket: str, key: str, max_bytes: int = MAX_JSON_BYTES,
             deadline: float | None = None) -> dict[str, Any] | Rejection:
    """Download and parse a small JSON object; never raises."""
    try:
        data = client.get(bucket, key, max_bytes=max_bytes, deadline=deadline)
    except StorageError as e:
        return rejection_for(e)
    except Exception as e:  # noqa: BLE001
        return unexpected(Reason.UNREACHABLE, e)
    return parse_json_object(data, max_bytes)
