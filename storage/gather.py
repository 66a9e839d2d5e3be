"""Fetch many peers' gradient payloads for one window, concurrently, under one deadline.

Per peer: HEAD (missing? too large? inside the put window?) → GET capped at
the size limit and the deadline → time check again on the object actually read
(it may have been replaced since the HEAD) → strict decode.  Each peer ends as
a :class:`~storage.wire.Payload` or a :class:`~dso.rejections.Rejection`.

Workers are daemon threads; when the deadline passes, :func:`gather` returns
at once, marking unfinished peers ``TIMEOUT`` and never joining stuck threads
(they end by themselves through per-request timeouts and the read deadline).
The deadline is measured from the start of the call and applies to every peer.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from dso.clock import PutWindow
from dso.rejections import Reason, Rejection
from storage import keys
from storage.client import S3Client, StorageError
from storage.commitment import BucketInfo, parse_commitment
from storage.jsonobj import rejection_for
from storage.wire import Expect, Payload, decode_payload, payload_size_cap



@dataclass
class GatherResult:
    payloads: dict[int, Payload] = field(default_factory=dict)
    rejections: dict[int, Rejection] = field(default_factory=dict)
    bytes_down: int = 0
    seconds: float = 0.0


class ReaderCache:
    """Read-only clients built from peers' commitments, reused across windows (LRU-bounded)."""

    def __init__(self, timeout: float = 10.0, max_attempts: int = 3, capacity: int = 1024):
        self.timeout, self.max_attempts, self.capacity = timeout, max_attempts, capacity
        self._clients: OrderedDict[BucketInfo, S3Client] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, info: BucketInfo) -> S3Client:
        with self._lock:
            client = self._clients.get(info)
            if client is not None:
                self._clients.move_to_end(info)
                return client
        client = S3Client(info.endpoint, info.region, info.access_key_id, info.secret_access_key,
                          timeout=self.timeout, max_attempts=self.max_attempts, max_pool_connections=4)
        with self._lock:
            self._clients[info] = client
            while len(self._clients) > self.capacity:
                self._clients.popitem(last=False)
        return client


DEFAULT_READERS = ReaderCache()
# Concurrent fetches, enough to hide network latency.  A stalled peer holds one worker until its
# deadline; the others carry on.
DEFAULT_WORKERS = 16
# The strict decode is Python and numpy work under the GIL: running several at once gains nothing and
# the threads' contention made every peer cost ~2x the CPU (K = 128 on loopback: 3.3 s with 16 decodes
# at once, 1.9 s with one; see docs/benchmarks.md).  Requests still overlap.
_DECODE_SLOTS = threading.BoundedSemaphore(1)


def check_time(put_window: PutWindow | None, last_modified: float) -> Rejection | None:
    if put_window is None:
        return None
    verdict = put_window.classify(last_modified)
    if verdict == "early":
        return Rejection(Reason.TOO_EARLY, f"LastModified {last_modified:.0f} < open {put_window.open:.3f} - 1 s")
    if verdict == "late":
        return Rejection(Reason.TOO_LATE, f"LastModified {last_modified:.0f} > close {put_window.close:.3f}")
    return None


def fetch_payload(client: S3Client, bucket: str, key: str, codec, expect: Expect, put_window: PutWindow | None,
                  deadline: float) -> tuple[Payload | Rejection, int]:
    """One peer's object → (Payload or Rejection, bytes downloaded).  Never raises."""
    cap = payload_size_cap(codec, expect.sync_samples)
    got = 0
    try:
        info = client.head(bucket, key)
        if info.size > cap:
            return Rejection(Reason.TOO_LARGE, f"HEAD says {info.size} bytes, cap {cap}"), 0
        bad = check_time(put_window, info.last_modified)
        if bad:
            return bad, 0
        if time.monotonic() > deadline:
            return Rejection(Reason.TIMEOUT, "deadline passed before download"), 0
        data, info = client.get_with_info(bucket, key, max_bytes=cap, deadline=deadline)
        got = len(data)
        bad = check_time(put_window, info.last_modified)
        if bad:
            return bad, got
    except StorageError as e:
        return rejection_for(e), got
    except Exception as e:  # noqa: BLE001 — a hostile server must not crash the caller
        return Rejection(Reason.UNREACHABLE, f"unexpected {type(e).__name__}: {str(e)[:160]}"), got
    with _DECODE_SLOTS:
        result = decode_payload(data, codec, expect)
    if isinstance(result, Payload):
        result.last_modified = info.last_modified
    return result, got


def gather(window: int, peers: dict[int, BucketInfo | str | None], codec, expect: Expect,
           put_window: PutWindow | None, deadline_seconds: float, max_workers: int | None = None,
           readers: ReaderCache | None = None, fetch=None) -> GatherResult:
    """Gather window ``window``'s payloads of ``peers`` (uid → BucketInfo, or the raw commitment string,
    or None when the peer has no commitment).  ``put_window=None`` skips the timing check.  ``fetch``
    replaces :func:`fetch_payload` per peer (same signature; commit-reveal uses storage.reveal's)."""
    if expect.window != window:
        raise ValueError(f"expect.window={expect.window} but gathering window {window}")
    started = time.monotonic()
    deadline = started + deadline_seconds
    readers = readers or DEFAULT_READERS
    fetch = fetch or fetch_payload
    result = GatherResult()
    jobs: queue.SimpleQueue = queue.SimpleQueue()
    for uid, peer in peers.items():
        info = parse_commitment(peer) if isinstance(peer, str) else peer
        if info is None:
            result.rejections[uid] = Rejection(Reason.MISSING, "no commitment on chain")
        elif isinstance(info, Rejection):
            result.rejections[uid] = info
        else:
            jobs.put((uid, info))
    pending = len(peers) - len(result.rejections)
    done: dict[int, tuple[Payload | Rejection, int]] = {}
    cond = threading.Condition()

    def worker() -> None:
        while True:
            try:
                uid, info = jobs.get_nowait()
            except queue.Empty:
                return
            if time.monotonic() > deadline:
                outcome = (Rejection(Reason.TIMEOUT, "deadline passed before this peer was started"), 0)
            else:
                try:
                    client = readers.get(info)
                    key = keys.gradient(window, uid, expect.protocol_version, expect.run)
                    outcome = fetch(client, info.bucket, key, codec, expect.for_uid(uid), put_window, deadline)
                except Exception as e:  # noqa: BLE001
                    outcome = (Rejection(Reason.UNREACHABLE, f"unexpected {type(e).__name__}: {str(e)[:160]}"), 0)
            with cond:
                done[uid] = outcome
                cond.notify_all()

    n_workers = max(1, min(pending, max_workers or DEFAULT_WORKERS))
    if pending:
        for i in range(n_workers):
            threading.Thread(target=worker, daemon=True, name=f"dso-gather-{window}-{i}").start()
    with cond:
        cond.wait_for(lambda: len(done) >= pending, timeout=max(0.0, deadline - time.monotonic()))
        finished = dict(done)  # threads still running after this write into `done` only
    for uid in peers:
        if uid in result.rejections:
            continue
        if uid not in finished:
            result.rejections[uid] = Rejection(Reason.TIMEOUT, f"not finished within {deadline_seconds:g} s")
            continue
        outcome, nbytes = finished[uid]
        result.bytes_down += nbytes
        if isinstance(outcome, Payload):
            result.payloads[uid] = outcome
        else:
            result.rejections[uid] = outcome
    result.seconds = time.monotonic() - started
    return result
