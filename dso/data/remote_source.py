"""Where a remote corpus comes from (:mod:`dso.data.remote_shards`): the source's protocol, the ways a read fails,
and the one-line-per-change log of its health."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("dso.data")
Sleep = Callable[[float], bool]                # sleeps; False when the node was asked to stop meanwhile


class Unreachable(Exception):
    """The source gave no usable answer.  ``permanent``: a missing object or refused keys (at start-up these
    end the start; later they are waited for like any other outage)."""

    def __init__(self, message: str, permanent: bool = False):
        super().__init__(message)
        self.permanent = permanent


class Oversized(Exception):
    """The object is larger than anything the manifest allows: refused like data that fails its check."""


class DataStopped(KeyboardInterrupt):
    """The node was asked to stop while it waited for its data: the step is cut short, as by a stop signal."""


class ObjectSource(Protocol):
    url: str   # where the corpus is, for messages (``s3://bucket/prefix``)

    def read(self, name: str, start: int = 0, length: int | None = None, limit: int | None = None) -> bytes:
        """Object ``name`` (or ``length`` bytes of it from ``start``), at most ``limit`` bytes; raises
        :class:`Unreachable`, or :class:`Oversized` past ``limit``."""
        ...


def plain_sleep(seconds: float) -> bool:
    time.sleep(seconds)
    return True


class Health:
    """One log line when the source stops answering and one when it answers again; one line when an object
    is refused (named) and one when a copy of it checks out."""

    def __init__(self, url: str, max_delay: float):
        self.url, self.max_delay = url, max_delay
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._refused: dict[str, float] = {}
        self.outages = 0

    def failed(self, why: str) -> None:
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since, self.outages = time.monotonic(), self.outages + 1
        log.warning("dataset %s does not answer (%s): waiting, retrying at most every %g s; no data is used "
                    "until it answers", self.url, why, self.max_delay)

    def answered(self) -> None:
        with self._lock:
            if self._down_since is None:
                return
            waited, self._down_since = time.monotonic() - self._down_since, None
        log.warning("dataset %s answers again after %.0f s: resuming", self.url, waited)

    def refused(self, what: str, problem: str) -> None:
        with self._lock:
            if what in self._refused:
                return
            self._refused[what] = time.monotonic()
        log.error("dataset %s: %s refused: %s; waiting for a copy that matches (retrying at most every %g s)",
                  self.url, what, problem, self.max_delay)

    def checked(self, what: str) -> None:
        with self._lock:
            since = self._refused.pop(what, None)
        if since is not None:
            log.warning("dataset %s: %s matches the manifest again after %.0f s: resuming", self.url, what,
                        time.monotonic() - since)
