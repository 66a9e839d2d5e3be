"""Chain writes off the caller's loop: a queue, one thread, and a log of what happened to each write.

A real chain's write waits for inclusion or finality (12 s blocks); a
validator must not stall its window loop on it.  :class:`ChainWriter` runs
writes one at a time in a background thread.  Each :meth:`ChainWriter.submit`
returns a :class:`WriteTicket`; when the write ends, its :class:`WriteResult`
(ok, or the refusal's reason and message) is appended to :attr:`results`, to
an optional JSONL file, and passed to ``on_result``.  A newer write with the
same ``key`` replaces one still waiting (a weight post superseded before it
was sent is reported ``superseded``); a full queue drops its oldest waiting
write (``dropped``).  No failure stops the thread.
"""
from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from dso.chain.base import Chain, ChainError


@dataclass(frozen=True)
class WriteResult:
    ticket: int
    kind: str
    ok: bool
    reason: str = ""          # ChainError reason, or superseded / dropped / error
    message: str = ""
    submitted_at: float = 0.0
    finished_at: float = 0.0
    value: Any = None         # what the write returned (not logged to the file)


_LOGGED = [f.name for f in fields(WriteResult) if f.name != "value"]


@dataclass(frozen=True)
class WriteTicket:
    id: int
    kind: str
    key: str | None


class ChainWriter:
    def __init__(self, *, max_pending: int = 16, log_path: str | Path | None = None,
                 on_result: Callable[[WriteResult], None] | None = None, keep: int = 1000):
        self._pending: deque[tuple[WriteTicket, Callable[[], Any], float]] = deque()
        self._cv = threading.Condition()
        self._ids = itertools.count(1)
        self._max_pending, self._on_result = max_pending, on_result
        self._log_path = Path(log_path).expanduser() if log_path else None
        self.results: deque[WriteResult] = deque(maxlen=keep)
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="chain-writer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ callers
    def submit(self, kind: str, write: Callable[[], Any], key: str | None = None) -> WriteTicket:
        """Queue ``write`` (a call doing one chain write); ``key`` lets a newer write replace a waiting one."""
        ticket = WriteTicket(next(self._ids), kind, key)
        now = time.time()
        with self._cv:
            if self._closed:
                raise RuntimeError("the chain writer is closed")
            if key is not None:
                for item in [i for i in self._pending if i[0].key == key]:
                    self._pending.remove(item)
                    self._record(item[0], False, "superseded", f"replaced by write {ticket.id}", item[2])
            if len(self._pending) >= self._max_pending:
                old = self._pending.popleft()
                self._record(old[0], False, "dropped", f"queue full ({self._max_pending} waiting)", old[2])
            self._pending.append((ticket, write, now))
            self._cv.notify_all()
        return ticket

    def set_weights(self, chain: Chain, wallet: Any, uids: list[int], weights: list[float],
                    version_key: int | None = None) -> WriteTicket:
        return self.submit("set_weights", lambda: chain.set_weights(wallet, uids, weights, version_key),
                           key="set_weights")

    def commit(self, chain: Chain, wallet: Any, data: str) -> WriteTicket:
        return self.submit("commit", lambda: chain.commit(wallet, data), key="commit")

    def result(self, ticket: WriteTicket) -> WriteResult | None:
        with self._cv:
            return next((r for r in self.results if r.ticket == ticket.id), None)

    def wait(self, timeout: float | None = None) -> bool:
        """Until nothing is waiting or running; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._pending or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Finish what is queued (up to ``timeout``), then stop the thread."""
        self.wait(timeout)
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout)

    # ------------------------------------------------------------- thread
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if not self._pending:
                    return
                ticket, write, submitted = self._pending.popleft()
                self._busy = True
            try:
                value = write()
                outcome = (True, "", "", value)
            except ChainError as e:
                outcome = (False, e.reason, str(e), None)
            except Exception as e:  # noqa: BLE001 — a surprise must not stop the writer
                outcome = (False, "error", f"{type(e).__name__}: {e}", None)
            with self._cv:
                self._record(ticket, *outcome[:3], submitted, value=outcome[3])
                self._busy = False
                self._cv.notify_all()

    def _record(self, ticket: WriteTicket, ok: bool, reason: str, message: str, submitted: float,
                value: Any = None) -> None:
        """(called with the lock held)"""
        result = WriteResult(ticket.id, ticket.kind, ok, reason, message, submitted, time.time(), value)
        self.results.append(result)
        if self._log_path is not None:
            try:
                self._log_path.parent.mkdir(parents=True, exist_ok=True)
                with open(self._log_path, "a") as f:
                    f.write(json.dumps({k: getattr(result, k) for k in _LOGGED}) + "\n")
            except OSError:
                pass  # the log is a convenience; the in-memory results stay
        if self._on_result is not None:
            try:
                self._on_result(result)
            except Exception:  # noqa: BLE001
                pass
