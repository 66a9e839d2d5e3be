"""The signature object: a miner's signed digest of its payload, published in its bucket before the payload.

Key ``{run}/signature/{window}/{uid}-v{v}.json`` (storage/keys.py), about 300 bytes of strict JSON:
``{format, run, window, uid, sha256, signature}`` where ``sha256`` is the digest of the payload bytes and
``signature`` the uid's hotkey's sr25519 signature over (run, window, uid, sha256) (dso/protocol/signatures.py).

Why a separate object, published first (docs/decisions/0301): the signature binds the digest of bytes
nobody else has yet, so the validator's own first sight of it (storage/look.py) dates the author's hold on
the bytes; a copier can sign its copy only once it has read the author's payload, which comes later.  The
payload's bytes stay exactly as before (no wire change), and a bundle carries each payload's signature in
its metadata (storage/aggregate.py).

Reading never raises: a Rejection says what is wrong (``UNSIGNED`` when there is no signature object,
``BAD_SIGNATURE`` when it does not verify, ``MALFORMED`` for a broken object).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dso.protocol import signatures
from dso.protocol.rejections import Reason, Rejection
from storage import keys
from storage.client import S3Client, StorageError
from storage.jsonobj import encode_json, parse_json_object, rejection_for

if TYPE_CHECKING:
    from storage.peer_client import PeerClient
    from storage.wire import Expect

FORMAT = "dso-signature/v1"
SIGNATURE_OBJECT_BYTES = 1024  # the object is ~330 bytes
_FIELDS = {"format", "run", "window", "uid", "sha256", "signature"}
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class Signed:
    """A signature object as read: the payload digest it signs, the signature, and the object's own digest
    (what the validator's look compares: the same object at the look and at the gather)."""

    sha256: str
    signature: str
    evidence: str


def encode(run: str, window: int, uid: int, sha256: str, signature: str) -> bytes:
    return encode_json({"format": FORMAT, "run": run, "window": window, "uid": uid, "sha256": sha256,
                        "signature": signature})


def parse(data: bytes, run: str, window: int, uid: int) -> Signed | Rejection:
    """A strict signature object for (run, window, uid), else a Rejection (MALFORMED / METADATA_MISMATCH)."""
    obj = parse_json_object(data, SIGNATURE_OBJECT_BYTES)
    if isinstance(obj, Rejection):
        return Rejection(obj.reason, f"signature object: {obj.detail}")
    problem = _problem(obj, run, window, uid)
    if problem:
        return Rejection(Reason.MALFORMED if problem[0] == "m" else Reason.METADATA_MISMATCH,
                         f"signature object: {problem[2:]}")
    return Signed(obj["sha256"], obj["signature"], hashlib.sha256(data).hexdigest())


def _problem(obj: dict[str, Any], run: str, window: int, uid: int) -> str | None:
    """'m:...' (malformed) or 'x:...' (fields of another run, window or uid), or None."""
    if set(obj) != _FIELDS:
        return f"m:keys {sorted(obj)[:8]}, expected {sorted(_FIELDS)}"
    if obj["format"] != FORMAT:
        return f"m:format {str(obj['format'])[:32]!r}, expected {FORMAT!r}"
    sha, sig = obj["sha256"], obj["signature"]
    if not (isinstance(sha, str) and len(sha) == 64 and set(sha) <= _HEX):
        return "m:sha256 is not 64 lowercase hex digits"
    if not signatures.is_signature(sig):
        return f"m:signature is not {signatures.SIGNATURE_HEX_CHARS} lowercase hex digits"
    for name, want in (("run", run), ("window", window), ("uid", uid)):
        got = obj[name]
        if type(got) is not type(want) or got != want:
            return f"x:{name} {str(got)[:24]!r}, expected {want!r}"
    return None


def check(data: bytes, signed: Signed, expect: Expect) -> Rejection | None:
    """Whether ``data`` are the bytes ``signed`` covers, signed by ``expect.signer`` for (run, window, uid)."""
    if expect.uid is None:
        raise ValueError("a signature check needs an Expect for one uid (Expect.for_peer)")
    sha = signatures.digest(data)
    if sha != signed.sha256:
        return Rejection(Reason.BAD_SIGNATURE, f"the signature covers sha256 {signed.sha256[:12]}…, the payload read "
                                               f"is {sha[:12]}…")
    problem = signatures.signature_problem(expect.signer, expect.run, expect.window, expect.uid, sha,
                                           signed.signature)
    return Rejection(Reason.BAD_SIGNATURE, problem) if problem else None


def read(client: S3Client | PeerClient, bucket: str, expect: Expect, deadline: float | None = None
         ) -> Signed | Rejection:
    """The peer's signature object for ``expect`` (uid, window, run): UNSIGNED when absent.  Never raises."""
    if expect.uid is None:
        raise ValueError("reading a signature needs an Expect for one uid (Expect.for_peer)")
    key = keys.signature(expect.window, expect.uid, expect.protocol_version, expect.run)
    try:
        data = client.get(bucket, key, max_bytes=SIGNATURE_OBJECT_BYTES, deadline=deadline)
    except StorageError as e:
        if e.kind == "missing":
            return Rejection(Reason.UNSIGNED, f"no signature object {key}")
        return rejection_for(e)
    return parse(data, expect.run, expect.window, expect.uid)


def put(client: S3Client, bucket: str, run: str, window: int, uid: int, version: int, sha256: str,
        signature: str) -> None:
    client.put(bucket, keys.signature(window, uid, version, run), encode(run, window, uid, sha256, signature),
               content_type="application/json")
