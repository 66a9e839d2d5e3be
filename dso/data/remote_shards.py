"""Shards read from an object store chunk by chunk, every chunk checked against the manifest before use.

The source is anything with ``read(name, start, length, limit)`` (:class:`ObjectSource`; the S3 one is
``storage.dataset.S3Source``): this module never speaks S3.  A corpus published with
``scripts/prepare_data.py --upload`` holds the manifest, ``tokenizer.json`` for a BPE, and per shard the
``.npy`` file and its ``.chunks`` file (the sha256 of each ``chunk_bytes`` piece of the shard's file).

What is checked, and against what:

* the manifest → its data hash against the run's (by the caller, :meth:`dso.data.dataset.Dataset.from_shard_set`);
* ``tokenizer.json`` → the tokeniser's hash in the manifest;
* a shard's ``.chunks`` file → ``chunks_sha256`` in the manifest;
* each chunk (a ranged read) → its digest in the ``.chunks`` file, then its ids against the vocabulary,
  and chunk 0's ``.npy`` header against the manifest's dtype and token count.

A chunk is checked when it arrives and again whenever it is read from the local cache: no byte reaches
a batch unchecked.  Start-up problems that waiting cannot mend (no manifest there, keys refused, a
manifest or tokeniser that is not the run's) end the start with one line (:class:`DataError`).  Later,
an endpoint that does not answer, a missing object or a chunk that fails its check is waited for:
one line when it starts (a refused chunk is named with its shard and number), retries with backoff up to
``max_delay`` seconds, one line when the data checks out again; the read that needed it then returns.

Chunks are fetched by a few worker threads, urgent ones (a batch being read now) before read-ahead. What a
read needed now fetched goes into a bounded disk cache (:class:`dso.data.chunk_cache.ChunkCache`); what the
read-ahead fetched stays in memory until read (:class:`dso.data.held_chunks.HeldChunks`, bounded too), and goes
to the disk cache only if it must make room before it was read.
"""
from __future__ import annotations

import hashlib
import io
import itertools
import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from dso.data.chunk_cache import ChunkCache
from dso.data.corpus import DataError
from dso.data.held_chunks import HeldChunks
from dso.data.remote_source import DataStopped, Health, ObjectSource, Oversized, Sleep, Unreachable, plain_sleep
from dso.data.shards import (
    DIGEST,
    MANIFEST,
    TOKENIZER_FILE,
    Manifest,
    ShardSet,
    TokenArray,
    chunks_name,
    manifest_tokenizer,
    npy_header,
    parse_manifest,
)

log = logging.getLogger("dso.data")
MANIFEST_LIMIT = TOKENIZER_LIMIT = 64 << 20   # bytes a manifest or tokenizer.json may have
HEADER_MAX = 4096                              # bytes a shard's .npy header may take (numpy writes 128)
WORKERS = 8
LISTS_IN_MEMORY = 256                          # shards whose chunk digests stay in memory
HELD_BYTES = 48 << 20                          # read-ahead chunks kept in memory (a window's 512 rows: 34 MB)


@dataclass
class _Job:
    future: Future[bytes] = field(default_factory=Future)
    started: bool = False
    urgent: bool = False   # a read waits for it: the chunk goes to the disk cache, not to memory


class RemoteCorpus:
    """Reads one corpus from ``source`` through ``cache``; :meth:`open` returns its :class:`ShardSet`."""

    def __init__(self, source: ObjectSource, cache: ChunkCache, sleep: Sleep = plain_sleep, workers: int = WORKERS,
                 first_delay: float = 1.0, max_delay: float = 30.0, held_bytes: int = HELD_BYTES):
        self.source, self.cache, self.sleep = source, cache, sleep
        self.held: HeldChunks[tuple[int, int]] = HeldChunks(held_bytes, self._to_cache)
        self.first_delay, self.max_delay, self.workers = first_delay, max_delay, workers
        self.health = Health(source.url, max_delay)
        self.manifest: Manifest | None = None
        self._lock = threading.Lock()
        self._lists: OrderedDict[int, bytes] = OrderedDict()
        self._offsets: dict[int, int] = {}
        self._jobs: dict[tuple[int, int], _Job] = {}
        self._queue: queue.PriorityQueue[tuple[int, int, tuple[int, int]]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._threads: list[threading.Thread] = []
        self.fetched_bytes = self.fetched_chunks = 0

    # ------------------------------------------------------------ start-up
    def open(self) -> ShardSet:
        manifest = parse_manifest(self._at_start(MANIFEST, MANIFEST_LIMIT), f"{self.source.url}/{MANIFEST}")
        if not manifest.chunk_bytes:
            raise DataError(f"{self.source.url}/{MANIFEST}: a version-1 manifest has no chunk digests, and a remote "
                            "corpus is checked chunk by chunk; publish it again with scripts/prepare_data.py --upload")
        self.manifest = manifest
        tokenizer = manifest_tokenizer(manifest, lambda: self._at_start(TOKENIZER_FILE, TOKENIZER_LIMIT).decode(
            "utf-8", errors="replace"), f"{self.source.url}/{TOKENIZER_FILE}")
        dtype = np.dtype(manifest.dtype)
        arrays = [RemoteShard(self, i, s.tokens, dtype) for i, s in enumerate(manifest.shards)]
        return ShardSet(self.source.url, manifest, tokenizer, arrays)

    def _at_start(self, name: str, limit: int) -> bytes:
        return self._until_good(name, lambda: self.source.read(name, limit=limit), lambda data: None, at_start=True)

    # ------------------------------------------------------------ waiting for good data
    def _until_good(self, what: str, read: Callable[[], bytes], check: Callable[[bytes], str | None],
                    at_start: bool = False) -> bytes:
        delay = self.first_delay
        while True:
            try:
                data = read()
            except Unreachable as e:
                if at_start and e.permanent:
                    raise DataError(f"dataset {self.source.url}: {e} (check --data.corpus, --data.endpoint and the "
                                    "dataset keys: --data.access_key_id or DSO_DATA_ACCESS_KEY_ID, none for a "
                                    "public bucket)") from None
                self.health.failed(str(e))
            except Oversized as e:
                self._refuse(what, str(e), at_start)
            else:
                problem = check(data)
                if problem is None:
                    self.health.answered()
                    self.health.checked(what)
                    return data
                self._refuse(what, problem, at_start)
            if not self.sleep(delay):
                raise DataStopped(f"stopped while waiting for {self.source.url}/{what}")
            delay = min(self.max_delay, delay * 2)

    def _refuse(self, what: str, problem: str, at_start: bool) -> None:
        if at_start:
            raise DataError(f"dataset {self.source.url}/{what}: {problem}")
        self.health.answered()  # it answered, with data that does not check out
        self.health.refused(what, problem)

    # ------------------------------------------------------------ chunk digests and headers
    def info(self, shard: int) -> tuple[str, int, int]:
        """(file, tokens, chunk_bytes) of a shard."""
        assert self.manifest is not None, "open() first"
        s = self.manifest.shards[shard]
        return s.file, s.tokens, self.manifest.chunk_bytes

    def digests(self, shard: int) -> bytes:
        """The shard's chunk digests (from memory, the cache or the source), checked against the manifest."""
        with self._lock:
            if shard in self._lists:
                self._lists.move_to_end(shard)
                return self._lists[shard]
        assert self.manifest is not None
        name, want = chunks_name(self.manifest.shards[shard].file), self.manifest.shards[shard].chunks_sha256
        _, tokens, size = self.info(shard)
        limit = DIGEST * ((tokens * np.dtype(self.manifest.dtype).itemsize + HEADER_MAX) // size + 2)

        def check(data: bytes) -> str | None:
            got = hashlib.sha256(data).hexdigest()
            return None if got == want else f"sha256 {got[:16]}… differs from the manifest's {want[:16]}…"
        data = self.cache.get(name)
        if data is None or check(data) is not None:
            data = self._until_good(name, lambda: self.source.read(name, limit=limit), check)
            self.cache.put(name, data)
        with self._lock:
            self._lists[shard] = data
            while len(self._lists) > LISTS_IN_MEMORY:
                self._lists.popitem(last=False)
        return data

    def check_chunk(self, shard: int, index: int, data: bytes) -> str | None:
        """None if ``data`` is chunk ``index`` of the shard, else what is wrong (records chunk 0's data offset)."""
        assert self.manifest is not None
        file, tokens, size = self.info(shard)
        digests = self.digests(shard)
        got = hashlib.sha256(data).digest()
        if got != digests[index * DIGEST:(index + 1) * DIGEST]:
            return f"sha256 {got.hex()[:16]}… differs from the manifest's {digests[index * DIGEST:][:8].hex()}…"
        dtype = np.dtype(self.manifest.dtype)
        start = 0
        if index == 0:
            try:
                fh = io.BytesIO(data)
                shape, fortran, got_dtype = npy_header(fh)
                start = fh.tell()
            except ValueError as e:
                return f"not a .npy header ({e})"
            chunks = -(-(start + tokens * dtype.itemsize) // size)
            if shape != (tokens,) or fortran or got_dtype != dtype or start > HEADER_MAX or \
                    chunks * DIGEST != len(digests):
                return (f"header says {got_dtype}{list(shape)} in {chunks} chunks, the manifest "
                        f"{dtype}[{tokens}] in {len(digests) // DIGEST}")
            with self._lock:
                self._offsets[shard] = start
        ids = np.frombuffer(data, dtype=dtype, offset=start, count=(len(data) - start) // dtype.itemsize)
        if ids.size and int(ids.max()) >= self.manifest.vocab_size:
            return f"holds token id {int(ids.max())}, outside the vocabulary of {self.manifest.vocab_size}"
        return None

    def data_offset(self, shard: int) -> int | None:
        with self._lock:
            return self._offsets.get(shard)

    # ------------------------------------------------------------ chunks
    @staticmethod
    def key(file: str, index: int) -> str:
        return f"{file}.{index}"

    def _to_cache(self, at: tuple[int, int], data: bytes) -> None:
        self.cache.put(self.key(self.info(at[0])[0], at[1]), data)

    def chunk(self, shard: int, index: int) -> bytes:
        """Chunk ``index`` of the shard, checked: held in memory (checked when it came), from the disk cache
        (checked again), or fetched now (waiting out any outage)."""
        held = self.held.take((shard, index))
        if held is not None:
            return held
        file, _, _ = self.info(shard)
        key = self.key(file, index)
        data = self.cache.get(key) if key in self.cache else None  # (no failed open for a chunk on its way)
        if data is not None:
            if self.check_chunk(shard, index, data) is None:
                return data
            self.cache.discard(self.key(file, index))  # a damaged cache file: fetch it again
        return self._submit(shard, index, urgent=True).result()

    def prefetch(self, shard: int, indices: list[int], urgent: bool) -> None:
        file, _, _ = self.info(shard)
        for index in indices:
            if self.key(file, index) not in self.cache and (shard, index) not in self.held:
                self._submit(shard, index, urgent)

    def _submit(self, shard: int, index: int, urgent: bool) -> Future[bytes]:
        key = (shard, index)
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                job = self._jobs[key] = _Job(urgent=urgent)
            else:
                job.urgent = job.urgent or urgent
                if not urgent or job.started:
                    return job.future
            self._queue.put((0 if urgent else 1, next(self._order), key))  # urgent: ahead of read-ahead
            while len(self._threads) < self.workers:
                thread = threading.Thread(target=self._work, name=f"dso-data-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        return job.future

    def _work(self) -> None:
        while True:
            _, _, key = self._queue.get()
            with self._lock:
                job = self._jobs.get(key)
                if job is None or job.started:
                    continue  # done already, or queued twice (read-ahead made urgent)
                job.started = True
            try:
                data = self._fetch(*key)
            except BaseException as e:  # noqa: BLE001 — DataStopped, or a bug: the reader hears of it
                with self._lock:
                    self._jobs.pop(key, None)
                job.future.set_exception(e)
                continue
            with self._lock:
                urgent = job.urgent
            if data and urgent:
                self._to_cache(key, data)
            elif data:
                self.held.hold(key, data)  # read-ahead: in memory until read, no cache file
            with self._lock:
                self._jobs.pop(key, None)
                self.fetched_bytes += len(data)
                self.fetched_chunks += bool(data)
            job.future.set_result(data)

    def _fetch(self, shard: int, index: int) -> bytes:
        """The checked chunk; b"" for an index past the shard's end (read-ahead guesses before the header)."""
        file, _, size = self.info(shard)
        if index >= len(self.digests(shard)) // DIGEST:
            return b""
        return self._until_good(f"{file} chunk {index} (bytes {index * size}-{(index + 1) * size - 1})",
                                lambda: self.source.read(file, index * size, size),
                                lambda data: self.check_chunk(shard, index, data))


def offset_or(offset: int | None) -> int:
    return 0 if offset is None else offset


class RemoteShard(TokenArray):
    """One shard of a :class:`RemoteCorpus`: ``shard[a:b]`` reads the chunks holding those ids, checked."""

    def __init__(self, corpus: RemoteCorpus, index: int, tokens: int, dtype: np.dtype):
        self.corpus, self.index, self.shape, self.dtype = corpus, index, (tokens,), dtype

    def __len__(self) -> int:
        return self.shape[0]

    def _byte_span(self, start: int, stop: int, offset: int) -> tuple[int, int]:
        return offset + start * self.dtype.itemsize, offset + stop * self.dtype.itemsize

    def __getitem__(self, index: slice) -> np.ndarray:
        start, stop, step = index.indices(self.shape[0]) if isinstance(index, slice) else (0, 0, 0)
        if step != 1:
            raise TypeError("RemoteShard supports contiguous slices only")
        if stop <= start:
            return np.empty(0, self.dtype)
        offset = self.corpus.data_offset(self.index)
        if offset is None:
            self.corpus.chunk(self.index, 0)  # its check reads the header
            offset = self.corpus.data_offset(self.index)
            assert offset is not None
        lo, hi = self._byte_span(start, stop, offset)
        size = self.corpus.info(self.index)[2]
        first, last = lo // size, (hi - 1) // size
        parts = [self.corpus.chunk(self.index, c) for c in range(first, last + 1)]
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        return np.frombuffer(data[lo - first * size:hi - first * size], dtype=self.dtype)

    def prefetch(self, spans: list[tuple[int, int]], urgent: bool) -> None:
        """Start fetching the chunks of these id spans.  Urgent (a batch about to be read): the shard's header
        is read first if it is not known yet, then exactly the spans' chunks are asked for.  Read-ahead returns
        at once: before the header is known, the spans are widened by the largest header allowed (and chunk 0,
        which holds it, is fetched too)."""
        offset = self.corpus.data_offset(self.index)
        if offset is None and urgent:
            self.corpus.chunk(self.index, 0)
            offset = self.corpus.data_offset(self.index)
        size = self.corpus.info(self.index)[2]
        wanted: set[int] = set() if offset is not None else {0}
        widen = HEADER_MAX if offset is None else 0
        last = (widen + offset_or(offset) + self.shape[0] * self.dtype.itemsize - 1) // size
        for a, b in spans:
            lo, hi = self._byte_span(a, b, offset_or(offset))
            wanted.update(range(lo // size, min(last, (hi - 1 + widen) // size) + 1))
        self.corpus.prefetch(self.index, sorted(wanted), urgent)

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        out = self[0:self.shape[0]]
        return out.astype(dtype) if dtype is not None else out
