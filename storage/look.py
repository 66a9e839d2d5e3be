"""The validator's own look at the uploads: when it first saw each, and what was there at the close.

A peer that serves its bucket from its own S3-compatible server can report any ``LastModified``, any ETag and any
listing.  So the validator reads every peer's *signature object* itself (storage/signature.py: the miner's signed
digest of its payload, published before the payload) and keeps the digest of the bytes it read — evidence no
header can fake.  Once the uploads closed (the put window's close for plain uploads; the reveal window's under
commit-reveal) it looks at every peer once, and the gather judges each payload it reads against that look
(:meth:`Look.judge`):

* **seen** at the look, and the gather read the same signature object (same digest) → counts; a different one →
  ``CHANGED`` (an honest miner never rewrites an upload);
* **absent** — the peer's server answered "no such object" to a request sent at or after ``certain`` — but
  present when read → ``TOO_LATE``.  ``certain`` is the first moment an object written from then on carries a
  LastModified after the close even on an honest server (S3 truncates it to whole seconds), plus a margin for
  clock skew: the look never calls late what an honest server's LastModified would call in time;
* **no answer** (timeout, error, the look ran out of time, or a look taken before ``certain``) decides
  nothing: the payload is judged by the LastModified rule alone.  The look runs on a loaded validator too, and a
  slow look must never make an honest, on-time miner late.

Under commit-reveal the validator also reads the *commitments*, between :func:`dso.protocol.clock.certain_after` the put
window's close and :func:`dso.protocol.clock.commit_look_ends`, before any miner reveals
(:meth:`Look.judge_commitment`):
a commitment absent then is ``NO_COMMIT``, and one read later with other content is ``CHANGED``, whatever its
server reports — so a peer serving its own bucket cannot commit late, or commit to a copy of what others
revealed, by pinning headers.

The copy tie-break orders uploads by when the validator first saw their signatures (:func:`watch`: while the
uploads are open it reads, every ``interval``, the signature objects of the peers it has not seen yet).  A miner
publishes its signature :func:`signature_lead` before its payload, more than two rounds, so the author's
signature is seen at least a round before any copier could have signed a copy of the payload.  Signatures first
seen in the same round, or first at the look, are "seen together" and proof of computation decides.  The watch
never rejects anything.

Neither the look nor the watch can be blinded by endpoints that never answer: peers are asked in the caller's
order (the validator's standing), peers that answered before go before peers that stayed silent, and each request
is held for at most a fraction of a second.  docs/scoring.md ("Upload times the peer cannot forge") and
docs/decisions/0301 record the rules and the measurements.
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dso.protocol.clock import LOOK_MARGIN_SECONDS, certain_after
from dso.protocol.payload import Payload
from dso.protocol.rejections import Reason, Rejection
from storage import keys
from storage.client import StorageError
from storage.commitment import BucketInfo, parse_commitment
from storage.gather import DEFAULT_PER_HOST, DEFAULT_READERS, DEFAULT_WORKERS, JOIN_GRACE_SECONDS, ReaderCache, host_of
from storage.schedule import FairSchedule, Job, ordered
from storage.wire import Expect

log = logging.getLogger("dso.look")
LOOK_SECONDS = 2.0          # the look's budget (small GETs only); a peer not answered by then is undecided
LOOK_PEER_SECONDS = 0.75    # each request's own deadline (a stalling server holds one worker this long)
WATCH_INTERVAL_SECONDS = 0.5  # while uploads are open, peers not seen yet are looked at this often (at most)
WATCH_ROUNDS_PER_PUT_WINDOW = 6  # ... and at least this many times in a put window
# A miner publishes its signature this long before its payload: more than two watch rounds, so the validator sees
# the author's signature in an earlier round than any copier's (a copy can be signed only once the payload is out).
SIGNATURE_LEAD_SECONDS = 2 * WATCH_INTERVAL_SECONDS + 0.1


def watch_interval(put_window_seconds: float) -> float:
    """Seconds between the watch's rounds for a run's put window: WATCH_INTERVAL_SECONDS, shorter for short windows
    (the signature's lead, two rounds, must leave the payload time to land inside the put window)."""
    return min(WATCH_INTERVAL_SECONDS, put_window_seconds / WATCH_ROUNDS_PER_PUT_WINDOW)


def signature_lead(put_window_seconds: float) -> float:
    """How long a miner waits between publishing its signature and its payload: two watch rounds and a margin
    (SIGNATURE_LEAD_SECONDS for a put window of 3 s or more; 0.6 s for the tests' 1.5 s put windows)."""
    return 2 * watch_interval(put_window_seconds) + 0.1
LOOK_OBJECT_BYTES = 1024    # signature and commitment objects are ~300 bytes


@dataclass(frozen=True)
class Seen:
    """One peer's object as the look read it."""

    evidence: str    # sha256 of the bytes read (never a header the peer's server chose)
    size: int
    asked: float     # time.time() when the request was sent
    answered: float  # ... and when its answer came


@dataclass
class Look:
    """What one look at the close found: ``seen`` objects, ``absent`` ones (uid → when the HEAD that found
    nothing was sent) and peers that gave no answer (``unanswered``)."""

    window: int
    close: float
    certain: float               # absences seen by a HEAD sent at or after this are certainly late
    started: float = field(default_factory=time.time)
    seen: dict[int, Seen] = field(default_factory=dict)
    absent: dict[int, float] = field(default_factory=dict)
    unanswered: set[int] = field(default_factory=set)
    first: dict[int, Seen] = field(default_factory=dict)  # from :func:`watch`: first sight while uploads were open
    silent: set[int] = field(default_factory=set)  # asked but gave no answer in time (go last next time)

    def seen_at(self, uid: int, evidence: str) -> float:
        """When the validator first saw this signature: the watch round that read these very bytes, else the look
        (everything first seen at the look is seen together)."""
        first = self.first.get(uid)
        return first.asked if first is not None and evidence and first.evidence == evidence else self.started

    def judge(self, uid: int, outcome: Payload | Rejection) -> Payload | Rejection:
        """A payload read after the look, against the look (module doc): its signature object's digest
        (``Payload.evidence``) must be the one the look read."""
        if not isinstance(outcome, Payload):  # absent (missing) or unreadable: that reason stands
            return outcome
        verdict = self.verdict(uid, outcome.evidence, "signature", Reason.TOO_LATE)
        if verdict is not None:
            return verdict
        outcome.seen = self.seen_at(uid, outcome.evidence)
        return outcome

    def judge_commitment(self, uid: int, evidence: str) -> Rejection | None:
        """Commit-reveal: a commitment read after the look at the commitments (taken before any reveal), by the
        digest of its bytes, or None when the look does not contradict it.  Absent then, it was written after the
        put window (or after reading the reveals), whatever LastModified its server reports."""
        return self.verdict(uid, evidence, "commitment", Reason.NO_COMMIT)

    def verdict(self, uid: int, evidence: str, what: str, late: Reason) -> Rejection | None:
        """CHANGED for an object other than the one the look read; ``late`` for one certainly absent then."""
        seen = self.seen.get(uid)
        if seen is not None and evidence != seen.evidence:
            return Rejection(Reason.CHANGED, f"{what} changed after the uploads closed (read {evidence[:12] or 'none'}"
                                             f"…, the look read {seen.evidence[:12]}…)")
        asked = self.absent.get(uid)
        if seen is None and asked is not None and asked >= self.certain:
            return Rejection(late, f"{what} absent when the validator looked {asked - self.close:.2f} s after "
                                   "the uploads closed")
        return None

    def summary(self) -> dict[str, Any]:
        """For the window's record: how late the look ran behind the close, and what it found."""
        answers = [s.answered for s in self.seen.values()]
        return {"started_after_close": round(self.started - self.close, 3),
                "behind_schedule": round(self.started - self.certain, 3),  # how late the validator began it
                "last_answer_after_close": round(max(answers) - self.close, 3) if answers else None,
                "seen": len(self.seen), "absent": len(self.absent), "unanswered": len(self.unanswered),
                "watched": len(self.first), "silent": len(self.silent)}


def watch(window: int, peers: dict[int, BucketInfo | str | None], expect: Expect, until: float, *,
          interval: float = WATCH_INTERVAL_SECONDS, readers: ReaderCache | None = None,
          key_for: Callable[[int], str] | None = None, stop: Callable[[], bool] | None = None,
          priority: Sequence[int] | None = None, silent: set[int] | None = None) -> dict[int, Seen]:
    """While the uploads are open (until ``until``), read every ``interval`` seconds the signature objects of the
    peers not seen yet: uid → :class:`Seen` with ``asked`` = the start of the round that first read it.  It only
    orders uploads for the copy tie-break (an author is seen a round before anyone who copied it) and never
    rejects; a peer seen once is not asked again — the look at the close catches content changed since, whose time
    is then the look's.

    Each round asks the peers in ``priority`` order, except that peers that stayed silent (asked, no answer) in an
    earlier round — or in ``silent``, the caller's memory of earlier windows, which it receives back updated —
    go last: endpoints that never answer cannot hold the workers before honest peers are asked."""
    first: dict[int, Seen] = {}
    quiet = set(silent or ())
    while (begun := time.time()) < until and not (stop is not None and stop()):
        budget = max(0.1, min(interval, until - begun))
        unseen = {u: info for u, info in peers.items() if u not in first}
        if not unseen:
            break
        found = look(window, unseen, expect, until, budget=budget, peer_seconds=budget, readers=readers,
                     key_for=key_for, priority=speakers_first(unseen, priority, quiet))
        for uid, seen in found.seen.items():
            first[uid] = Seen(seen.evidence, seen.size, found.started, seen.answered)
        quiet = (quiet | found.silent) - set(found.seen) - set(found.absent)
        time.sleep(max(0.0, min(begun + interval, until) - time.time()))
    if silent is not None:
        silent.clear()
        silent.update(quiet)
    return first


def speakers_first(uids: Iterable[int], priority: Sequence[int] | None, silent: set[int]) -> list[int]:
    """``uids`` in ``priority`` order (then by uid), those in ``silent`` moved to the end (same order among them)."""
    order = ordered(uids, priority)
    return [u for u in order if u not in silent] + [u for u in order if u in silent]


def look(window: int, peers: dict[int, BucketInfo | str | None], expect: Expect, close: float, *,
         budget: float = LOOK_SECONDS, peer_seconds: float = LOOK_PEER_SECONDS, readers: ReaderCache | None = None,
         key_for: Callable[[int], str] | None = None, margin: float = LOOK_MARGIN_SECONDS,
         max_workers: int | None = None, priority: Sequence[int] | None = None) -> Look:
    """Read every peer's small object for ``window`` at once (fair schedule in ``priority`` order, per-peer
    deadlines, never raises) and return what was found.  ``close``: when the uploads closed; ``key_for(uid)``:
    the key (default: the peer's signature object)."""
    result = Look(window, close, certain_after(close, margin))
    deadline = time.monotonic() + budget
    readers = readers or DEFAULT_READERS
    key_for = key_for or (lambda uid: keys.signature(window, uid, expect.protocol_version, expect.run))
    jobs = []
    for uid in ordered(peers, priority):
        info = parse_commitment(peers[uid]) if isinstance(peers[uid], str) else peers[uid]
        if isinstance(info, BucketInfo) and readers.refusal(info) is None:
            jobs.append(Job(uid, host_of(info), info))
    result.unanswered = {job.uid for job in jobs}
    n_workers = max(1, min(len(jobs), max_workers or DEFAULT_WORKERS))
    schedule = FairSchedule(jobs, n_workers, deadline, DEFAULT_PER_HOST, min(peer_seconds, budget))
    lock = threading.Lock()

    def worker() -> None:
        while (taken := schedule.take()) is not None:
            job, peer_deadline = taken
            asked = time.time()
            try:
                data = readers.get(job.payload).get(job.payload.bucket, key_for(job.uid), max_bytes=LOOK_OBJECT_BYTES,
                                                    deadline=min(peer_deadline, time.monotonic() + peer_seconds))
                answer: Seen | float = Seen(hashlib.sha256(data).hexdigest(), len(data), asked, time.time())
            except StorageError as e:
                answer = asked if e.kind == "missing" else -1.0
            except Exception:  # noqa: BLE001 — no answer; a hostile server must not crash the caller
                answer = -1.0
            finally:
                schedule.done(job)
            with lock:
                if time.monotonic() > deadline or (not isinstance(answer, Seen) and answer < 0):
                    result.silent.add(job.uid)  # asked, and no usable answer in time: undecided
                elif isinstance(answer, Seen):
                    result.seen[job.uid] = answer
                    result.unanswered.discard(job.uid)
                else:
                    result.absent[job.uid] = answer
                    result.unanswered.discard(job.uid)

    threads = [threading.Thread(target=worker, daemon=True, name=f"dso-look-{window}-{i}")
               for i in range(n_workers if jobs else 0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline + JOIN_GRACE_SECONDS - time.monotonic()))
    with lock:  # a worker still busy past its join gives its answer to nobody
        return Look(result.window, result.close, result.certain, result.started, dict(result.seen),
                    dict(result.absent), set(result.unanswered), silent=set(result.silent))
