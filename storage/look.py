"""The validator's own look at the uploads when they close: an upload time a peer cannot forge (issue 17).

A peer that serves its bucket from its own S3-compatible server can report any ``LastModified``.  So the
validator HEADs every peer's object itself, once, shortly after the uploads close (the put window's close
for plain uploads; the reveal window's close under commit-reveal, where the payload is revealed), and the
gather judges each payload it reads against that look (:meth:`Look.judge`):

* **seen** at the look, same ETag and size when read → counts; seen but different when read → ``CHANGED``
  (an honest miner never rewrites an upload);
* **absent** — the peer's server answered "no such object" to a HEAD sent at or after ``certain`` — but
  present when read → ``TOO_LATE``.  ``certain`` is the first moment an object written from then on carries a
  LastModified after the close even on an honest server (S3 truncates it to whole seconds), plus a margin for
  clock skew: the look never calls late what an honest server's LastModified would call in time;
* **no answer** (timeout, error, the look ran out of time, or a look taken before ``certain``) decides
  nothing: the payload is judged by the LastModified rule alone, as before issue 17.  The look runs on a loaded
  validator too, and a slow look must never make an honest, on-time miner late.

Under commit-reveal the validator also looks at the *commitments*, between :func:`dso.clock.certain_after` the put
window's close and :func:`dso.clock.commit_look_ends`, before any miner reveals (:meth:`Look.judge_commitment`):
a commitment absent then is ``NO_COMMIT`` whatever its LastModified says, so a peer serving its own bucket cannot
commit late, or commit to a copy of what others revealed, by backdating.

The copy tie-break orders uploads by when the validator first saw them (:func:`watch`: while the uploads are open
it looks every half second at the peers it has not seen yet); uploads first seen in the same round, or first at
the look, are "seen together" and proof of computation decides.  The watch never rejects anything.
docs/scoring.md ("Upload times the peer cannot forge") records the rule and the measured lateness of the look.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from dso.clock import LOOK_MARGIN_SECONDS, certain_after
from dso.rejections import Reason, Rejection
from storage import keys
from storage.client import StorageError
from storage.commitment import BucketInfo, parse_commitment
from storage.gather import DEFAULT_PER_HOST, DEFAULT_READERS, DEFAULT_WORKERS, JOIN_GRACE_SECONDS, ReaderCache, host_of
from storage.schedule import FairSchedule, Job
from dso.payload import Payload
from storage.wire import Expect

log = logging.getLogger("dso.look")
LOOK_SECONDS = 2.0          # the look's budget (HEADs only); a peer not answered by then is undecided
LOOK_PEER_SECONDS = 1.5     # each HEAD's own deadline (a stalling server holds one worker this long)
WATCH_INTERVAL_SECONDS = 0.5  # while uploads are open, peers not seen yet are looked at this often


@dataclass(frozen=True)
class Seen:
    """One peer's object as the look found it."""

    etag: str
    size: int
    asked: float     # time.time() when the HEAD was sent
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

    def seen_at(self, uid: int, etag: str) -> float:
        """When the validator first saw this content: the watch round that found it, if the watch saw these very
        bytes (same ETag), else the look (everything first seen at the look is seen together)."""
        first = self.first.get(uid)
        return first.asked if first is not None and first.etag and first.etag == etag else self.started

    def judge(self, uid: int, outcome: Payload | Rejection) -> Payload | Rejection:
        """A payload read after the look, against the look (module doc)."""
        if not isinstance(outcome, Payload):  # absent (missing) or unreadable: that reason stands
            return outcome
        verdict = self.verdict(uid, outcome.etag, outcome.nbytes, "object", Reason.TOO_LATE)
        if verdict is not None:
            return verdict
        outcome.seen = self.seen_at(uid, outcome.etag)
        return outcome

    def judge_commitment(self, uid: int, etag: str, size: int) -> Rejection | None:
        """Commit-reveal: a commitment read after the look at the commitments (taken before any reveal), or
        None when the look does not contradict it.  Absent then, it was written after the put window (or
        after reading the reveals), whatever LastModified its server reports."""
        return self.verdict(uid, etag, size, "commitment", Reason.NO_COMMIT)

    def verdict(self, uid: int, etag: str, size: int, what: str, late: Reason) -> Rejection | None:
        """CHANGED for an object other than the one the look saw; ``late`` for one certainly absent then."""
        seen = self.seen.get(uid)
        if seen is not None and (size != seen.size or (seen.etag and etag != seen.etag)):
            return Rejection(Reason.CHANGED, f"{what} changed after the uploads closed (size {seen.size} → {size})")
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
                "watched": len(self.first)}


def watch(window: int, peers: dict[int, BucketInfo | str | None], expect: Expect, until: float, *,
          interval: float = WATCH_INTERVAL_SECONDS, readers: ReaderCache | None = None,
          key_for: Callable[[int], str] | None = None, stop: Callable[[], bool] | None = None) -> dict[int, Seen]:
    """While the uploads are open (until ``until``), look every ``interval`` seconds at the peers not seen yet:
    uid → :class:`Seen` with ``asked`` = the start of the round that first found the object.  It only orders
    uploads for the copy tie-break (an author is seen a round before anyone who copied it) and never rejects;
    a peer seen once is not asked again — the look at the close catches content changed since, whose time is
    then the look's."""
    first: dict[int, Seen] = {}
    while (begun := time.time()) < until and not (stop is not None and stop()):
        budget = max(0.1, min(interval, until - begun))
        unseen = {u: info for u, info in peers.items() if u not in first}
        if not unseen:
            break
        found = look(window, unseen, expect, until, budget=budget, peer_seconds=budget, readers=readers,
                     key_for=key_for)
        for uid, seen in found.seen.items():
            first[uid] = Seen(seen.etag, seen.size, found.started, seen.answered)
        time.sleep(max(0.0, min(begun + interval, until) - time.time()))
    return first


def look(window: int, peers: dict[int, BucketInfo | str | None], expect: Expect, close: float, *,
         budget: float = LOOK_SECONDS, peer_seconds: float = LOOK_PEER_SECONDS, readers: ReaderCache | None = None,
         key_for: Callable[[int], str] | None = None, margin: float = LOOK_MARGIN_SECONDS,
         max_workers: int | None = None) -> Look:
    """HEAD every peer's object for ``window`` at once (fair schedule, per-peer deadlines, never raises) and
    return what was found.  ``close``: when the uploads closed; ``key_for(uid)``: the key (default: the
    payload's)."""
    result = Look(window, close, certain_after(close, margin))
    deadline = time.monotonic() + budget
    readers = readers or DEFAULT_READERS
    key_for = key_for or (lambda uid: keys.gradient(window, uid, expect.protocol_version, expect.run))
    jobs = []
    for uid in sorted(peers):
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
                head = readers.get(job.payload).head(job.payload.bucket, key_for(job.uid),
                                                     deadline=min(peer_deadline, time.monotonic() + peer_seconds))
                answer: Seen | float = Seen(str(head.etag), int(head.size), asked, time.time())
            except StorageError as e:
                answer = asked if e.kind == "missing" else -1.0
            except Exception:  # noqa: BLE001 — no answer; a hostile server must not crash the caller
                answer = -1.0
            finally:
                schedule.done(job)
            with lock:
                if time.monotonic() > deadline:
                    continue  # too late for this look: undecided
                if isinstance(answer, Seen):
                    result.seen[job.uid] = answer
                elif answer >= 0:
                    result.absent[job.uid] = answer
                else:
                    continue
                result.unanswered.discard(job.uid)

    threads = [threading.Thread(target=worker, daemon=True, name=f"dso-look-{window}-{i}")
               for i in range(n_workers if jobs else 0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline + JOIN_GRACE_SECONDS - time.monotonic()))
    with lock:
        return Look(result.window, result.close, result.certain, result.started, dict(result.seen),
                    dict(result.absent), set(result.unanswered))
