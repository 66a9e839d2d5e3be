"""A bounded cache of fetched corpus chunks on local disk, least recently used out first.

A node that reads its corpus from an object store keeps the chunks it fetched in files under
``--data.cache_dir`` so that a chunk read again (the validation rows every window, rows of a small
corpus, a restart) costs no request.  The cache never holds more than ``limit_bytes``: room is made
*before* a chunk is written.  Files on disk, not memory, so the cache adds nothing to the process's
resident set; it is no trust boundary either — whoever reads a chunk checks it against its digest
(:mod:`dso.data.remote_shards`), every time.

Several processes on one machine (the local network) share ``--data.cache_dir``: each claims a slot
folder of its own with an advisory lock (``fcntl.flock``), so no process evicts another's files or
counts them against its own bound, and a restarted node finds its slot's files again.
"""
from __future__ import annotations

import fcntl
import os
import re
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

from dso.data.corpus import DataError

MAX_SLOTS = 256
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")


class ChunkCache:
    """``get(key)`` / ``put(key, data)`` of byte strings, at most ``limit_bytes`` in files under ``root``."""

    def __init__(self, root: str | Path, limit_bytes: int):
        if limit_bytes < 0:
            raise ValueError("cache limit must be >= 0")
        self.limit = limit_bytes
        self.dir, self._lock_fd = claim_slot(Path(root).expanduser())
        self._lock = threading.Lock()
        self._index: OrderedDict[str, int] = OrderedDict()  # key → size, least recently used first
        self.used = 0
        self.hits = self.misses = 0
        self._load()
        self.peak = self.used

    def _load(self) -> None:
        """Index what an earlier process of this slot left (oldest first), dropping half-written files."""
        found = []
        for entry in os.scandir(self.dir):
            if entry.name.startswith(".tmp") or not _KEY.fullmatch(entry.name):
                if entry.name != ".lock":
                    Path(entry.path).unlink(missing_ok=True)
                continue
            st = entry.stat()
            found.append((st.st_mtime_ns, entry.name, st.st_size))
        for _, name, size in sorted(found):
            self._index[name] = size
            self.used += size
        with self._lock:
            self._make_room(0)

    def get(self, key: str) -> bytes | None:
        try:
            data = (self.dir / _checked(key)).read_bytes()
        except FileNotFoundError:  # (an indexed file still being written counts until it is evicted)
            with self._lock:
                self.misses += 1
            return None
        with self._lock:
            self.hits += 1
            if key in self._index:
                self._index.move_to_end(key)
        return data

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._index

    def put(self, key: str, data: bytes) -> None:
        """Keep ``data`` under ``key`` (replacing an older copy), evicting the least recently used first."""
        path = self.dir / _checked(key)
        size = len(data)
        with self._lock:
            if size > self.limit:
                return  # larger than the whole cache: not kept
            self.used -= self._index.pop(key, 0)
            self._make_room(size)
            self._index[key] = size
            self.used += size
            self.peak = max(self.peak, self.used)
        tmp = ""
        try:
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.dir)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except OSError:  # a full disk: the cache is an optimisation, the caller has its bytes
            if tmp:
                Path(tmp).unlink(missing_ok=True)
            self.discard(key)

    def discard(self, key: str) -> None:
        with self._lock:
            self.used -= self._index.pop(key, 0)
        (self.dir / _checked(key)).unlink(missing_ok=True)

    def _make_room(self, size: int) -> None:
        """Evict until ``size`` more bytes fit (the caller holds the lock)."""
        while self._index and self.used + size > self.limit:
            old, old_size = self._index.popitem(last=False)
            self.used -= old_size
            (self.dir / old).unlink(missing_ok=True)

    def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the slot
            self._lock_fd = -1


def _checked(key: str) -> str:
    if not _KEY.fullmatch(key):
        raise ValueError(f"cache key {key!r}: letters, digits, '.', '_' and '-' only")
    return key


def claim_slot(root: Path) -> tuple[Path, int]:
    """The first ``root/slot-N`` folder no other process holds, locked for this process's lifetime."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(MAX_SLOTS):
        folder = root / f"slot-{i}"
        folder.mkdir(exist_ok=True)
        fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return folder, fd
    raise DataError(f"{root}: all {MAX_SLOTS} cache slots are held by other processes")
