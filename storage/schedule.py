"""The order and time budget in which gather's workers take peers (docs/storage.md, "Gather").

* Order: the caller's priority list first (e.g. peers by last-window standing), then the others by uid.
* Per host: at most ``max_per_host`` peers of one endpoint host in flight; a worker skips to the next
  peer whose host has room (one server behind many commitments cannot occupy every worker).
* Per peer: a deadline set when the peer starts, its fair share of what is left of the budget
  (:func:`peer_share`), so peers that stall cannot push the others past the budget.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")  # what a job carries (gather: the peer's BucketInfo)


def peer_share(left: float, workers: int, outstanding: int, floor: float) -> float:
    """Seconds a peer that starts now may take: ``left × workers / max(workers, outstanding)``, at least
    ``floor``, never more than ``left``.  ``outstanding`` counts every peer not finished (this one too).

    If every outstanding peer used its whole share, ``workers`` of them at a time, the last would end
    when the budget does; peers that finish early leave their time to the ones after them."""
    if left <= 0:
        return 0.0
    share = left * workers / max(workers, outstanding, 1)
    return min(left, max(share, floor))


def ordered(uids: Iterable[int], priority: Sequence[int] | None) -> list[int]:
    """``uids`` with those in ``priority`` first (in its order), the rest ascending; each once."""
    pool = set(uids)
    first = [u for u in dict.fromkeys(priority or ()) if u in pool]
    seen = set(first)
    return first + sorted(u for u in pool if u not in seen)


@dataclass
class Job(Generic[T]):
    uid: int
    host: Hashable
    payload: T


class FairSchedule(Generic[T]):
    """Thread-safe queue of jobs with per-host limits and per-job deadlines inside one budget."""

    def __init__(self, jobs: list[Job[T]], workers: int, deadline: float, max_per_host: int, floor: float):
        self._pending = list(jobs)
        self._busy: Counter[Hashable] = Counter()
        self._running = 0
        self.workers, self.deadline, self.max_per_host, self.floor = workers, deadline, max_per_host, floor
        self._cond = threading.Condition()

    def take(self) -> tuple[Job[T], float] | None:
        """The next job whose host has room and its deadline; None when none is left or the budget is
        spent.  Waits while every remaining job's host is busy."""
        with self._cond:
            while True:
                now = time.monotonic()
                if now >= self.deadline or not self._pending:
                    return None
                for i, job in enumerate(self._pending):
                    if self._busy[job.host] < self.max_per_host:
                        del self._pending[i]
                        self._busy[job.host] += 1
                        self._running += 1
                        share = peer_share(self.deadline - now, self.workers,
                                           len(self._pending) + self._running, self.floor)
                        return job, now + share
                self._cond.wait(self.deadline - now)

    def done(self, job: Job[T]) -> None:
        with self._cond:
            self._busy[job.host] -= 1
            self._running -= 1
            self._cond.notify_all()
