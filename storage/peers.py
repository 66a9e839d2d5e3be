"""The validator's peers list: ``{run}/peers/{window}-v{v}.json``, the top-G uids in effect for that window.

``{"window": t, "version": v, "uids": [...], ...}`` — other keys (e.g. the
validator's uid, scores) are carried through as ``extra``.  Parsing is strict:
size cap, exact types, unique non-negative uids, bounded count.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeGuard

from dso.protocol.rejections import Reason, Rejection
from storage import keys
from storage.client import ObjectReader, S3Client
from storage.jsonobj import MAX_JSON_BYTES, encode_json, get_json, parse_json_object, put_json

MAX_UIDS = 4096


@dataclass(frozen=True)
class PeersList:
    window: int
    version: int
    uids: tuple[int, ...]
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        reserved = {"window", "version", "uids"} & set(self.extra)
        if reserved:
            raise ValueError(f"extra must not override {sorted(reserved)}")
        return {**self.extra, "window": self.window, "version": self.version, "uids": list(self.uids)}


def _nat(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2 ** 63


def peers_from_json(obj: dict[str, Any], expect_window: int | None = None,
                    version: int | None = None) -> PeersList | Rejection:
    window, ver, uids = obj.get("window"), obj.get("version"), obj.get("uids")
    if not (_nat(window) and _nat(ver) and isinstance(uids, list)):
        return Rejection(Reason.MALFORMED, "peers list needs integer window, version and a uids list")
    if len(uids) > MAX_UIDS or not all(_nat(u) for u in uids) or len(set(uids)) != len(uids):
        return Rejection(Reason.MALFORMED, f"uids must be at most {MAX_UIDS} unique non-negative integers")
    if version is not None and ver != version:
        return Rejection(Reason.METADATA_MISMATCH, f"version {ver}, expected {version}")
    if expect_window is not None and window != expect_window:
        return Rejection(Reason.METADATA_MISMATCH, f"window {window}, expected {expect_window}")
    extra = {k: v for k, v in obj.items() if k not in ("window", "version", "uids")}
    return PeersList(window, ver, tuple(uids), extra)


def parse_peers(data: bytes, expect_window: int | None = None, version: int | None = None
                ) -> PeersList | Rejection:
    obj = parse_json_object(data, MAX_JSON_BYTES)
    return obj if isinstance(obj, Rejection) else peers_from_json(obj, expect_window, version)


def encode_peers(peers: PeersList) -> bytes:
    return encode_json(peers.to_json())


def put_peers(client: S3Client, bucket: str, peers: PeersList, run: str = "") -> str:
    key = keys.peers(peers.window, peers.version, run)
    put_json(client, bucket, key, peers.to_json())
    return key


def get_peers(client: ObjectReader, bucket: str, window: int, version: int, run: str = "") -> PeersList | Rejection:
    obj = get_json(client, bucket, keys.peers(window, version, run))
    return obj if isinstance(obj, Rejection) else peers_from_json(obj, window, version)
