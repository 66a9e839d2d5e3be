"""Commit-reveal in S3 (ZIP-400 §4, ZIP-407 §3; docs/extensions.md §2): the objects and how a window is read.

With ``hparams.commit_reveal`` a miner's upload for window t is split in two:

* put window:    ``commit/{t}/{uid}-v{v}.json`` = {format, window, uid, commitment}, where
  ``commitment = dso.protocol.commit.commitment_hash(t, uid, payload bytes, nonce)``;
* reveal window: ``reveal/{t}/{uid}-v{v}.json`` = {format, window, uid, nonce (64 hex)} and the payload
  itself at the usual ``gradient/{t}/{uid}-v{v}.safetensors`` (wire format unchanged).

A reader (validator or miner) accepts a payload only when the commitment landed inside the put window,
the nonce and the payload inside the reveal window (S3 LastModified, design §2 tolerance) and the hash
matches (:func:`dso.protocol.commit.judge_reveal`).  Outcomes are the shared :class:`~dso.protocol.rejections.Reason`
values; nothing here raises on what a peer uploaded.
"""
from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, cast

from dso.codec.codecs import Codec
from dso.protocol import signatures
from dso.protocol.clock import PutWindow, reveal_window_after
from dso.protocol.commit import NONCE_BYTES, commitment_hash, is_commitment, judge_reveal, new_nonce
from dso.protocol.payload import Payload
from dso.protocol.rejections import Reason, Rejection, unexpected
from storage import keys, signature
from storage.client import ObjectInfo, S3Client, StorageError
from storage.commitment import BucketInfo
from storage.gather import (
    DEFAULT_OPTIONS,
    Fetch,
    GatherOptions,
    GatherResult,
    check_time,
    decode_signed,
    fetch_payload,
    gather,
)
from storage.jsonobj import encode_json, parse_json_object, rejection_for
from storage.look import Look
from storage.peer_client import PeerClient
from storage.wire import Expect, payload_size_cap

COMMIT_FORMAT = "dso-commit/v1"
REVEAL_FORMAT = "dso-reveal/v1"
SMALL_JSON_BYTES = 1024  # both objects are ~200 bytes


@dataclass(frozen=True)
class Sealed:
    """What a miner keeps between committing and revealing (in memory only: a miner restarted in
    between cannot reveal, and is judged NO_REVEAL for that window)."""

    window: int
    uid: int
    payload: bytes
    nonce: bytes
    commitment: str
    signature: str = ""  # the miner's signature of the payload (dso/protocol/signatures.py), published with the reveal


def seal(payload: bytes, window: int, uid: int, nonce: bytes | None = None, signature: str = "") -> Sealed:
    nonce = new_nonce() if nonce is None else nonce
    return Sealed(window, uid, payload, nonce, commitment_hash(window, uid, payload, nonce), signature)


# --------------------------------------------------------------- objects
def commit_object(window: int, uid: int, commitment: str) -> dict[str, Any]:
    return {"format": COMMIT_FORMAT, "window": window, "uid": uid, "commitment": commitment}


def reveal_object(window: int, uid: int, nonce: bytes) -> dict[str, Any]:
    return {"format": REVEAL_FORMAT, "window": window, "uid": uid, "nonce": bytes(nonce).hex()}


def _header_problem(obj: dict[str, Any], fmt: str, field: str, window: int, uid: int) -> str | None:
    if set(obj) != {"format", "window", "uid", field}:
        return f"keys {sorted(obj)[:6]}, expected format, window, uid, {field}"
    if obj["format"] != fmt:
        return f"format {str(obj['format'])[:32]!r}, expected {fmt!r}"
    for name, want in (("window", window), ("uid", uid)):
        got = obj[name]
        if isinstance(got, bool) or not isinstance(got, int) or got != want:
            return f"{name} {str(got)[:24]!r}, expected {want}"
    return None


def parse_commit(obj: dict[str, Any], window: int, uid: int) -> str | Rejection:
    """The commitment string of a strict commit object, else BAD_COMMITMENT."""
    problem = _header_problem(obj, COMMIT_FORMAT, "commitment", window, uid)
    if problem is None and not is_commitment(obj["commitment"]):
        problem = "commitment is not 64 lowercase hex digits"
    return Rejection(Reason.BAD_COMMITMENT, f"commit object: {problem}") if problem else obj["commitment"]


def parse_reveal(obj: dict[str, Any], window: int, uid: int) -> bytes | Rejection:
    """The nonce of a strict reveal object, else MALFORMED."""
    problem = _header_problem(obj, REVEAL_FORMAT, "nonce", window, uid)
    nonce = obj.get("nonce")
    if problem is None and not (isinstance(nonce, str) and len(nonce) == 2 * NONCE_BYTES
                                and all(c in "0123456789abcdef" for c in nonce)):
        problem = f"nonce is not {2 * NONCE_BYTES} lowercase hex digits"
    return Rejection(Reason.MALFORMED, f"reveal object: {problem}") if problem else bytes.fromhex(cast(str, nonce))


# ---------------------------------------------------------------- writes
def put_commit(client: S3Client, bucket: str, sealed: Sealed, version: int, run: str = "") -> None:
    client.put(bucket, keys.commit(sealed.window, sealed.uid, version, run),
               encode_json(commit_object(sealed.window, sealed.uid, sealed.commitment)),
               content_type="application/json")


def put_reveal(client: S3Client, bucket: str, sealed: Sealed, version: int, run: str = "") -> None:
    """The nonce and the signature first, then the payload: a reader that sees the payload finds both."""
    client.put(bucket, keys.reveal(sealed.window, sealed.uid, version, run),
               encode_json(reveal_object(sealed.window, sealed.uid, sealed.nonce)), content_type="application/json")
    if sealed.signature:
        signature.put(client, bucket, run, sealed.window, sealed.uid, version, signatures.digest(sealed.payload),
                      sealed.signature)
    client.put(bucket, keys.gradient(sealed.window, sealed.uid, version, run), sealed.payload)


# ----------------------------------------------------------------- reads
def _small_json(client: S3Client | PeerClient, bucket: str, key: str,
                deadline: float) -> tuple[dict[str, Any] | Rejection | None, ObjectInfo, bytes]:
    """(object | None when absent | Rejection, its info (LastModified 0 when not read), the bytes read)."""
    try:
        data, info = client.get_with_info(bucket, key, max_bytes=SMALL_JSON_BYTES, deadline=deadline)
    except StorageError as e:
        return (None if e.kind == "missing" else rejection_for(e)), ObjectInfo(key, 0, 0.0), b""
    return parse_json_object(data, SMALL_JSON_BYTES), info, data


def fetch_revealed(client: S3Client | PeerClient, bucket: str, key: str, codec: Codec, expect: Expect,
                   reveal: PutWindow | None, deadline: float, *, put: PutWindow,
                   commitments_look: Look | None = None) -> tuple[Payload | Rejection, int]:
    """One peer's window under commit-reveal → (Payload or Rejection, bytes read).  Never raises.

    Same signature as :func:`storage.gather.fetch_payload` (``reveal`` in the place of the put window),
    so :func:`storage.gather.gather` runs it per peer.  The accepted payload's ``last_modified`` is its
    *commitment's*: who committed first is what copy detection compares.  ``commitments_look``: the
    validator's look at the commitments before the reveals (storage/look.py); it overrules LastModified."""
    counted = [0]
    try:
        return _fetch_revealed(client, bucket, key, codec, expect, reveal, deadline, put, counted,
                               commitments_look), counted[0]
    except StorageError as e:
        return rejection_for(e), counted[0]
    except Exception as e:  # noqa: BLE001 — a hostile server must not crash the caller
        return unexpected(Reason.UNREACHABLE, e), counted[0]


def _fetch_revealed(client: S3Client | PeerClient, bucket: str, key: str, codec: Codec, expect: Expect,
                    reveal: PutWindow | None, deadline: float, put: PutWindow,
                    counted: list[int], commitments_look: Look | None) -> Payload | Rejection:
    """The commitment, the payload's HEAD, the nonce, then (committed in time and revealed) the payload itself,
    and the verdict on them.  ``counted[0]`` adds up the bytes read, also when this raises."""
    window, uid = expect.window, expect.uid
    if uid is None:  # gather passes expect.for_uid(uid); without it the keys below would name uid 'None'
        raise ValueError("commit-reveal fetch needs an Expect for one uid (Expect.for_uid)")
    committed = _read_commitment(client, bucket, expect, uid, deadline, counted, commitments_look)
    if isinstance(committed, Rejection):
        return committed
    commitment, commit_time = committed
    committed_in_time = commitment is not None and put.classify(commit_time) == "ok"
    clock = _RevealClock(reveal)
    cap = payload_size_cap(codec, expect.sync_samples)
    head = _head_payload(client, bucket, key, cap, clock, deadline)
    if isinstance(head, Rejection):
        return head
    nonce = _read_nonce(client, bucket, expect, uid, clock, deadline, counted)
    if isinstance(nonce, Rejection):
        return nonce
    revealed = head is not None and nonce is not None and not clock.late
    data, signed = b"", None  # without a download judge_reveal decides NO_COMMIT / NO_REVEAL / MISSING
    if revealed and committed_in_time:
        downloaded = _download(client, bucket, key, cap, expect, clock, deadline, counted)
        if isinstance(downloaded, Rejection):
            return downloaded
        data, signed = downloaded
        revealed = not clock.late
    if clock.late and not committed_in_time:
        return Rejection(Reason.TOO_LATE, "; ".join(clock.late))
    verdict = judge_reveal(commitment, committed_in_time, data if revealed else None,
                           nonce if revealed else None, window, uid)
    if verdict is not None:
        return Rejection(verdict.reason, f"{verdict.detail} ({'; '.join(clock.late)})") if clock.late else verdict
    # the accepted payload's time is its commitment's: who committed first is what copy detection compares
    return decode_signed(data, signed, codec, expect, commit_time)


@dataclass
class _RevealClock:
    """The reveal window's check on the objects revealed: one that landed after the window is noted in ``late``
    (not revealed in time, the verdict says so); one readable before it is TOO_EARLY."""

    reveal: PutWindow | None
    late: list[str] = field(default_factory=list)

    def check(self, what: str, last_modified: float) -> Rejection | None:
        bad = check_time(self.reveal, last_modified)
        if bad is not None and bad.reason == Reason.TOO_LATE:
            self.late.append(f"{what} {bad.detail}")
            return None
        if bad is not None:  # readable before commitments closed: exactly what commit-reveal forbids
            return Rejection(Reason.TOO_EARLY, f"{what} revealed before the reveal window: {bad.detail}")
        return None


def _read_commitment(client: S3Client | PeerClient, bucket: str, expect: Expect, uid: int, deadline: float,
                     counted: list[int], commitments_look: Look | None) -> tuple[str | None, float] | Rejection:
    """(the peer's commitment, None when it has none; its LastModified), or why the commit object is refused."""
    window = expect.window
    obj, commit_info, raw = _small_json(client, bucket, keys.commit(window, uid, expect.protocol_version, expect.run),
                                        deadline)
    counted[0] += len(raw)
    if isinstance(obj, Rejection):
        return obj if obj.reason != Reason.MALFORMED else Rejection(Reason.BAD_COMMITMENT, f"commit object: {obj}")
    commitment = None if obj is None else parse_commit(obj, window, uid)
    if isinstance(commitment, Rejection):
        return commitment
    if commitment is not None and commitments_look is not None:  # the look overrules forgeable headers
        contradicted = commitments_look.judge_commitment(uid, hashlib.sha256(raw).hexdigest())
        if contradicted is not None:
            return contradicted
    return commitment, commit_info.last_modified


def _head_payload(client: S3Client | PeerClient, bucket: str, key: str, cap: int, clock: _RevealClock,
                  deadline: float) -> ObjectInfo | Rejection | None:
    """The payload's HEAD (None when absent), or TOO_LARGE / TOO_EARLY."""
    try:
        head = client.head(bucket, key, deadline=deadline)
    except StorageError as e:
        if e.kind != "missing":
            raise
        return None
    if head.size > cap:
        return Rejection(Reason.TOO_LARGE, f"HEAD says {head.size} bytes, cap {cap}")
    return clock.check("payload", head.last_modified) or head


def _read_nonce(client: S3Client | PeerClient, bucket: str, expect: Expect, uid: int, clock: _RevealClock,
                deadline: float, counted: list[int]) -> bytes | Rejection | None:
    """The revealed nonce (None when not revealed), or why the reveal object is refused."""
    key = keys.reveal(expect.window, uid, expect.protocol_version, expect.run)
    obj, reveal_info, raw = _small_json(client, bucket, key, deadline)
    counted[0] += len(raw)
    if isinstance(obj, Rejection):
        return obj
    nonce = None if obj is None else parse_reveal(obj, expect.window, uid)
    if nonce is None or isinstance(nonce, Rejection):
        return nonce
    return clock.check("nonce", reveal_info.last_modified) or nonce


def _download(client: S3Client | PeerClient, bucket: str, key: str, cap: int, expect: Expect, clock: _RevealClock,
              deadline: float, counted: list[int]) -> tuple[bytes, signature.Signed | None] | Rejection:
    """The signature (when ``expect.signer``; it goes up with the reveal, before the payload), then the payload."""
    signed: signature.Signed | None = None
    if expect.signer is not None:
        read = signature.read(client, bucket, expect, deadline)
        if isinstance(read, Rejection):
            return read
        signed = read
    if time.monotonic() > deadline:
        return Rejection(Reason.TIMEOUT, "deadline passed before download")
    data, info = client.get_with_info(bucket, key, max_bytes=cap, deadline=deadline)
    counted[0] += len(data)
    return clock.check("payload", info.last_modified) or (data, signed)


@dataclass(frozen=True)
class CommitReveal:
    """The run uploads under commit-reveal: a commitment in the put window, the payload and its nonce in the reveal
    window that follows.  ``commitments_look``: the validator's look at the commitments before the reveals."""

    commitments_look: Look | None = None


def gather_window(window: int, peers: dict[int, BucketInfo | str | None], codec: Codec, expect: Expect, put: PutWindow,
                  deadline_seconds: float, options: GatherOptions = DEFAULT_OPTIONS,
                  reveal: CommitReveal | None = None) -> GatherResult:
    """Gather window ``window``'s updates the way the run's settings say: plain (``reveal`` None: the payload in the
    put window) or commit-reveal.  ``options``: how to read, schedule and judge (:class:`GatherOptions`; its
    ``fetch`` is this function's).  The result's ``peer_seconds`` holds uid → seconds spent fetching that peer (a
    peer cut off by the deadline: the whole gather's time; a peer never fetched, e.g. without a commitment:
    absent)."""
    fetch: Fetch = (partial(fetch_revealed, put=put, commitments_look=reveal.commitments_look) if reveal is not None
                    else fetch_payload)
    timed: dict[int, float] = {}
    lock = threading.Lock()

    def fetch_timed(client: PeerClient, bucket: str, key: str, codec: Codec, expect: Expect,
                    put_window: PutWindow | None, deadline: float) -> tuple[Payload | Rejection, int]:
        started = time.monotonic()
        try:
            return fetch(client, bucket, key, codec, expect, put_window, deadline)
        finally:
            with lock:
                if expect.uid is not None:  # always set by gather (expect.for_uid)
                    timed[expect.uid] = time.monotonic() - started

    result = gather(window, peers, codec, expect, reveal_window_after(put) if reveal is not None else put,
                    deadline_seconds, replace(options, fetch=fetch_timed))
    with lock:  # workers cut off by the deadline may still finish (and write) after gather returned
        result.peer_seconds.update(timed)
    for uid, rejection in result.rejections.items():
        if rejection.reason == Reason.TIMEOUT and uid not in result.peer_seconds:
            result.peer_seconds[uid] = result.seconds
    return result
