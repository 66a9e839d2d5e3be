"""Corpus chunks fetched ahead of need, kept in memory until the reader takes them (:mod:`dso.data.remote_shards`).

A miner's read-ahead fetches the chunks of rows it reads once: written to the disk cache, each would cost a
file created, read back and checked again (more CPU than the ranged GET itself on a 2-core machine,
docs/decisions/0501-ranged-gets-with-libcurl.md). Held here instead, a chunk checked on arrival is handed to
the reader as it is: the bytes never leave the process. At most ``limit`` bytes are held; past it chunks
read already go first (nowhere: a read-ahead chunk is rarely read twice, and the next window's read-ahead
must not push out this window's unread chunks), then the oldest unread ones, to the disk cache (``spill``).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class HeldChunks(Generic[K]):
    """Checked chunks by key, at most ``limit`` bytes: chunks read already make room first (oldest read
    first), then the oldest unread."""

    def __init__(self, limit: int, spill: Callable[[K, bytes], None]):
        self.limit, self._spill = limit, spill
        self._lock = threading.Lock()
        self._unread: OrderedDict[K, bytes] = OrderedDict()
        self._read: OrderedDict[K, bytes] = OrderedDict()
        self.used = self.peak = self.spilled = self.dropped = 0

    def hold(self, key: K, data: bytes) -> None:
        """Keep ``data`` (checked) for the reader, making room first."""
        out: list[tuple[K, bytes]] = []
        with self._lock:
            old = self._unread.pop(key, None)
            if old is None:
                old = self._read.pop(key, None)
            self.used += len(data) - (len(old) if old is not None else 0)
            self._unread[key] = data
            while self.used > self.limit and self._read:
                self.used -= len(self._read.popitem(last=False)[1])
                self.dropped += 1
            while self.used > self.limit:
                out.append(self._unread.popitem(last=False))
                self.used -= len(out[-1][1])
            self.spilled += len(out)
            self.peak = max(self.peak, self.used)
        for gone, gone_data in out:  # (outside the lock: a file is written)
            self._spill(gone, gone_data)

    def take(self, key: K) -> bytes | None:
        """The chunk, if held (it stays, marked read, until room is needed)."""
        with self._lock:
            data = self._unread.pop(key, None)
            if data is None:
                data = self._read.pop(key, None)
            if data is not None:
                self._read[key] = data
            return data

    def __len__(self) -> int:
        with self._lock:
            return len(self._unread) + len(self._read)

    def __contains__(self, key: K) -> bool:
        with self._lock:
            return key in self._unread or key in self._read
