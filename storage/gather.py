"""Fetch many peers' gradient payloads for one window, concurrently, fairly, under one budget.

Per peer: HEAD (missing? too large? inside the put window?) → GET capped at
the size limit and the peer's deadline → time check again on the object actually
read (it may have been replaced since the HEAD) → strict decode.  Each peer ends
as a :class:`~storage.wire.Payload` or a :class:`~dso.protocol.rejections.Rejection`.

Fairness (docs/storage.md, "Gather"): peers are started in the caller's
``priority`` order (e.g. by last-window standing), then by uid; each peer gets
its own deadline when it starts — its fair share of what is left of the window's
budget, ``left × workers / max(workers, outstanding peers)``, at least
``min_peer_seconds`` — enforced inside every socket operation by
:class:`~storage.peer_client.PeerClient`; at most ``max_per_host`` requests run
against one endpoint host at a time.  A silent or slow-dripping peer therefore
costs one worker for its share and no more, and cannot push honest peers past
the budget.  When the budget is spent, unfinished peers are ``TIMEOUT``; the
workers are joined before :func:`gather` returns (each one's socket is closed by
its own deadline), so no thread or socket outlives the window.
"""
from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from dso.codec.codecs import Codec
from dso.protocol import signatures
from dso.protocol.clock import PutWindow
from dso.protocol.payload import Payload
from dso.protocol.rejections import Reason, Rejection, unexpected
from storage import keys, signature
from storage.client import StorageError
from storage.commitment import BucketInfo, parse_commitment
from storage.endpoints import EndpointPolicy, address_problem
from storage.jsonobj import rejection_for
from storage.peer_client import PeerClient
from storage.schedule import FairSchedule, Job, ordered
from storage.wire import Expect, decode_payload, payload_size_cap

if TYPE_CHECKING:
    from dso.config.schema import StorageConfig

log = logging.getLogger("dso.gather")


@dataclass
class GatherResult:
    payloads: dict[int, Payload] = field(default_factory=dict)
    rejections: dict[int, Rejection] = field(default_factory=dict)
    bytes_down: int = 0
    seconds: float = 0.0
    finished: dict[int, float] = field(default_factory=dict)  # uid → seconds from the start to its outcome
    peer_seconds: dict[int, float] = field(default_factory=dict)  # uid → seconds spent on it (storage.reveal)


class ReaderCache:
    """Read-only clients built from peers' commitments, reused across windows (LRU-bounded).

    ``allow_loopback`` (``storage.allow_loopback_endpoints``) lets peers' endpoints be loopback
    addresses over plain http: local networks and tests only; everything else must be public https."""

    def __init__(self, timeout: float = 10.0, max_attempts: int = 3, capacity: int = 1024,
                 allow_loopback: bool = False):
        self.timeout, self.max_attempts, self.capacity = timeout, max_attempts, capacity
        self.policy = EndpointPolicy(allow_loopback=allow_loopback)
        self._clients: OrderedDict[BucketInfo, PeerClient] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, storage_cfg: StorageConfig) -> ReaderCache:
        """The node's reader cache as :class:`dso.config.schema.StorageConfig` says."""
        return cls(timeout=storage_cfg.timeout_seconds, allow_loopback=storage_cfg.allow_loopback_endpoints)

    def refusal(self, info: BucketInfo) -> Rejection | None:
        """What the policy says of the endpoint *before* any lookup: an address written in the URL, or a
        plain-http URL in a run without loopback endpoints.  Names are checked again after resolution."""
        parts = urlsplit(info.endpoint)
        where = f"endpoint {info.endpoint[:80]}"
        try:
            ipaddress.ip_address(parts.hostname or "")
        except ValueError:  # a name: its addresses are checked after resolution, only the scheme now
            if parts.scheme != "https" and not self.policy.allow_loopback:
                return Rejection(Reason.BAD_COMMITMENT, f"{where}: only https endpoints")
            return None
        problem = address_problem(parts.hostname or "", parts.scheme, self.policy)  # an address (parsed above)
        return Rejection(Reason.BAD_COMMITMENT, f"{where}: {problem}") if problem else None

    def get(self, info: BucketInfo) -> PeerClient:
        with self._lock:
            client = self._clients.get(info)
            if client is not None:
                self._clients.move_to_end(info)
                return client
        client = PeerClient(info, self.policy, timeout=self.timeout, max_attempts=self.max_attempts)
        with self._lock:
            self._clients[info] = client
            while len(self._clients) > self.capacity:
                self._clients.popitem(last=False)
        return client


DEFAULT_READERS = ReaderCache()
# Concurrent fetches.  A stalled peer holds one worker for its share of the budget and costs no CPU;
# the strict decodes are serialised anyway (below), so more workers only add overlapping waits.
DEFAULT_WORKERS = 32
# Requests at once against one endpoint host: one host serving many sybil commitments cannot take more
# than this many workers.
DEFAULT_PER_HOST = 8
# A peer's deadline is never shorter than this (unless the budget itself is): a slow but honest link
# must be able to finish one payload even when many peers are outstanding.
MIN_PEER_SECONDS = 1.0
# After the budget: how long gather waits for its workers to notice (their sockets are already bounded).
JOIN_GRACE_SECONDS = 2.0
# The strict decode is Python and numpy work under the GIL: running several at once gains nothing and
# the threads' contention made every peer cost ~2x the CPU (K = 128 on loopback: 3.3 s with 16 decodes
# at once, 1.9 s with one; see docs/benchmarks.md).  Requests still overlap.
_DECODE_SLOTS = threading.BoundedSemaphore(1)

# one peer's outcome and the bytes downloaded for it
Outcome = tuple[Payload | Rejection, int]
# one peer's fetch: (client, bucket, key, codec, expect, put window, deadline) -> (outcome, bytes downloaded)
Fetch = Callable[[PeerClient, str, str, Codec, Expect, PutWindow | None, float], Outcome]
# a last say on one peer's outcome: (uid, outcome) -> outcome
Judge = Callable[[int, Payload | Rejection], Payload | Rejection]


def check_time(put_window: PutWindow | None, last_modified: float) -> Rejection | None:
    if put_window is None:
        return None
    verdict = put_window.classify(last_modified)
    if verdict == "early":
        return Rejection(Reason.TOO_EARLY, f"LastModified {last_modified:.0f} < open {put_window.open:.3f} - 1 s")
    if verdict == "late":
        return Rejection(Reason.TOO_LATE, f"LastModified {last_modified:.0f} > close {put_window.close:.3f}")
    return None


def fetch_payload(client: PeerClient, bucket: str, key: str, codec: Codec, expect: Expect, put_window: PutWindow | None,
                  deadline: float) -> tuple[Payload | Rejection, int]:
    """One peer's object → (Payload or Rejection, bytes downloaded).  Never raises.  With ``expect.signer`` set,
    the peer's signature object is read after the payload and must cover it (storage/signature.py)."""
    cap = payload_size_cap(codec, expect.sync_samples)
    got = 0
    signed: signature.Signed | None = None
    try:
        info = client.head(bucket, key, deadline=deadline)
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
        if expect.signer is not None:  # an honest miner's signature went up before its payload
            read = signature.read(client, bucket, expect, deadline)
            if isinstance(read, Rejection):
                return read, got
            signed = read
    except StorageError as e:
        return rejection_for(e), got
    except Exception as e:  # noqa: BLE001 — a hostile server must not crash the caller
        return unexpected(Reason.UNREACHABLE, e), got
    return decode_signed(data, signed, codec, expect, info.last_modified), got


def decode_signed(data: bytes, signed: signature.Signed | None, codec: Codec, expect: Expect,
                  last_modified: float | None) -> Payload | Rejection:
    """The signature check (when ``signed``), then the strict decode (one at a time); the Payload keeps its bytes,
    their digest and signature.  Never raises."""
    if signed is not None:
        bad = signature.check(data, signed, expect)
        if bad:
            return bad
    with _DECODE_SLOTS:
        result = decode_payload(data, codec, expect)
    if isinstance(result, Payload):
        result.last_modified, result.raw, result.sha256 = last_modified, data, signatures.digest(data)
        if signed is not None:
            result.signature, result.evidence = signed.signature, signed.evidence
    return result


def host_of(info: BucketInfo) -> tuple[str, str, int | None]:
    parts = urlsplit(info.endpoint)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


@dataclass(frozen=True)
class GatherOptions:
    """How :func:`gather` reads, schedules and judges the peers; the defaults are a node's.

    How to read: ``readers`` builds each peer's client; ``fetch`` reads one peer (same signature as
    :func:`fetch_payload`, which it defaults to; commit-reveal passes storage.reveal's).
    The schedule: ``priority`` are uids to start first, in this order (the validator passes its peers by
    last-window standing); ``max_workers`` fetches at once; ``max_per_host`` requests at once per endpoint host;
    ``min_peer_seconds`` the least time a started peer is given (see :func:`storage.schedule.peer_share`).
    What is accepted: ``hotkeys`` is uid → hotkey on chain, whose signature every payload must carry (None:
    signatures are not checked); ``judge(uid, outcome)`` has a last say on each peer's outcome (the validator's
    look at the close, :meth:`storage.look.Look.judge`)."""

    readers: ReaderCache = DEFAULT_READERS
    fetch: Fetch = fetch_payload
    priority: Sequence[int] | None = None
    max_workers: int = DEFAULT_WORKERS
    max_per_host: int = DEFAULT_PER_HOST
    min_peer_seconds: float = MIN_PEER_SECONDS
    hotkeys: Mapping[int, str] | None = None
    judge: Judge | None = None

    def __post_init__(self) -> None:
        if self.max_workers < 1 or self.max_per_host < 1 or self.min_peer_seconds < 0:
            raise ValueError(f"max_workers={self.max_workers} and max_per_host={self.max_per_host} must be >= 1, "
                             f"min_peer_seconds={self.min_peer_seconds} >= 0")


DEFAULT_OPTIONS = GatherOptions()


def gather(window: int, peers: dict[int, BucketInfo | str | None], codec: Codec, expect: Expect,
           put_window: PutWindow | None, deadline_seconds: float,
           options: GatherOptions = DEFAULT_OPTIONS) -> GatherResult:
    """Gather window ``window``'s payloads of ``peers`` (uid → BucketInfo, or the raw commitment string,
    or None when the peer has no commitment) within ``deadline_seconds``.  ``put_window=None`` skips the
    timing check.  ``options``: how to read, schedule and judge (:class:`GatherOptions`)."""
    if expect.window != window:
        raise ValueError(f"expect.window={expect.window} but gathering window {window}")
    started = time.monotonic()
    result = GatherResult()
    jobs = _jobs(peers, options, result.rejections)
    finished = _fetch_all(window, jobs, codec, expect, put_window, options, started, started + deadline_seconds)
    result.finished = {uid: seconds for uid, (_, seconds) in finished.items()}
    _collect(result, peers, {uid: outcome for uid, (outcome, _) in finished.items()}, deadline_seconds)
    result.seconds = time.monotonic() - started
    return result


def _jobs(peers: dict[int, BucketInfo | str | None], options: GatherOptions,
          rejections: dict[int, Rejection]) -> list[Job[BucketInfo]]:
    """One job per peer with a readable commitment and an endpoint the policy allows, in the order they
    start; every other peer's rejection goes into ``rejections``."""
    jobs: list[Job[BucketInfo]] = []
    for uid in ordered(peers, options.priority):
        peer = peers[uid]
        info = parse_commitment(peer) if isinstance(peer, str) else peer
        if info is None:
            rejections[uid] = Rejection(Reason.MISSING, "no commitment on chain")
        elif isinstance(info, Rejection):
            rejections[uid] = info
        elif (refused := options.readers.refusal(info)) is not None:
            rejections[uid] = refused
        else:
            jobs.append(Job(uid, host_of(info), info))
    return jobs


def _fetch_all(window: int, jobs: list[Job[BucketInfo]], codec: Codec, expect: Expect, put_window: PutWindow | None,
               options: GatherOptions, started: float, deadline: float) -> dict[int, tuple[Outcome, float]]:
    """Run ``jobs`` on a pool of workers under the fair schedule until all are done or ``deadline`` passes:
    uid → (outcome, seconds from ``started``) of the peers finished in time.  The workers are joined
    before it returns."""
    n_workers = max(1, min(len(jobs), options.max_workers))
    schedule = FairSchedule(jobs, n_workers, deadline, options.max_per_host, options.min_peer_seconds)
    done: dict[int, tuple[Outcome, float]] = {}
    cond = threading.Condition()

    def worker() -> None:
        while (taken := schedule.take()) is not None:
            job, peer_deadline = taken
            try:
                outcome = _fetch_one(window, job, codec, expect, put_window, options, peer_deadline)
            finally:
                schedule.done(job)
            with cond:
                done[job.uid] = (outcome, time.monotonic() - started)
                cond.notify_all()

    threads = [threading.Thread(target=worker, daemon=True, name=f"dso-gather-{window}-{i}")
               for i in range(n_workers if jobs else 0)]
    for thread in threads:
        thread.start()
    with cond:
        cond.wait_for(lambda: len(done) >= len(jobs), timeout=max(0.0, deadline - time.monotonic()))
        finished = dict(done)  # what ends after the budget counts as a timeout
    for thread in threads:  # each in-flight request ends at its own deadline, at the latest the budget's
        thread.join(max(0.0, deadline + JOIN_GRACE_SECONDS - time.monotonic()))
    stuck = sum(t.is_alive() for t in threads)
    if stuck:
        log.warning("window %d: %d gather workers still busy %.1f s after the budget (a slow DNS lookup?)",
                    window, stuck, JOIN_GRACE_SECONDS)
    return finished


def _fetch_one(window: int, job: Job[BucketInfo], codec: Codec, expect: Expect, put_window: PutWindow | None,
               options: GatherOptions, peer_deadline: float) -> Outcome:
    """One peer's fetch and the judge's last say on it.  Never raises."""
    try:
        client = options.readers.get(job.payload)
        key = keys.gradient(window, job.uid, expect.protocol_version, expect.run)
        outcome = options.fetch(client, job.payload.bucket, key, codec, expect.for_peer(job.uid, options.hotkeys),
                                put_window, peer_deadline)
        if options.judge is not None:
            outcome = (options.judge(job.uid, outcome[0]), outcome[1])
    except Exception as e:  # noqa: BLE001 — a hostile server must not crash the caller
        outcome = (unexpected(Reason.UNREACHABLE, e), 0)
    return outcome


def _collect(result: GatherResult, peers: dict[int, BucketInfo | str | None], finished: dict[int, Outcome],
             deadline_seconds: float) -> None:
    """Every peer not already rejected ends in ``result``: its payload or rejection, or TIMEOUT when it did not
    finish within the budget; ``bytes_down`` adds up what the finished peers downloaded."""
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
