"""The training corpus in an object store: ``--data.corpus s3://BUCKET/PREFIX``.

:class:`S3Source` is the S3 side of :class:`dso.data.remote_shards.ObjectSource`: whole GETs for the manifest,
the tokeniser and the chunk digests, ranged GETs for chunks (:mod:`storage.ranged`); every failure becomes
:class:`~dso.data.remote_source.Unreachable` (a missing object or refused keys marked permanent, which only
matters at start-up).  :func:`open_dataset` is what a node calls: a local corpus as before, or the
remote one through a bounded disk cache, checked against the run's data hash.

Keys: ``--data.access_key_id`` / ``--data.secret_access_key``, else ``DSO_DATA_ACCESS_KEY_ID`` /
``DSO_DATA_SECRET_ACCESS_KEY``, else none: unsigned requests, which a public-read bucket answers.  Never
the node's own write key (``AWS_ACCESS_KEY_ID``): it is not sent to a dataset endpoint that may be
someone else's.  Endpoint and region default to ``--storage.endpoint`` / ``--storage.region``.
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from dso.config.schema import DataConfig, HParams, StorageConfig, expand
from dso.data.chunk_cache import ChunkCache
from dso.data.corpus import DataError
from dso.data.dataset import Dataset, is_remote_corpus
from dso.data.remote_shards import RemoteCorpus
from dso.data.remote_source import Oversized, Sleep, Unreachable, plain_sleep
from dso.data.shards import ShardSet
from storage.client import S3Client, StorageError
from storage.ranged import RangedGets

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
DATA_KEY_ENV, DATA_SECRET_ENV = "DSO_DATA_ACCESS_KEY_ID", "DSO_DATA_SECRET_ACCESS_KEY"
DATA_ATTEMPTS = 2   # botocore's own retries per request; the reader waits and retries beyond them


@dataclass(frozen=True)
class CorpusURL:
    bucket: str
    prefix: str   # "" or a key prefix without leading or trailing "/"

    @classmethod
    def parse(cls, text: str) -> CorpusURL:
        if not text.startswith("s3://"):
            raise ValueError(f"{text!r}: expected s3://BUCKET/PREFIX")
        bucket, _, prefix = text[len("s3://"):].partition("/")
        if not _BUCKET.fullmatch(bucket) or ".." in bucket:
            raise ValueError(f"{text!r}: {bucket!r} is not a bucket name (3-63 of a-z, 0-9, '.', '-')")
        prefix = prefix.strip("/")
        if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
            raise ValueError(f"{text!r}: the prefix has an empty, '.' or '..' part")
        return cls(bucket, prefix)

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


class S3Source:
    """Objects under ``url`` through ``client`` (:class:`dso.data.remote_shards.ObjectSource`)."""

    def __init__(self, client: S3Client, url: CorpusURL):
        self.client, self.where = client, url
        self.url = str(url)
        self.ranges = RangedGets(client.signed_get, client.timeout)

    def read(self, name: str, start: int = 0, length: int | None = None, limit: int | None = None) -> bytes:
        key = self.where.key(name)
        try:
            if length is not None:
                return self.ranges.get(self.where.bucket, key, start, length)
            return self.client.get(self.where.bucket, key, max_bytes=limit)
        except StorageError as e:
            if e.kind == "too_large":
                raise Oversized(str(e)) from None
            raise Unreachable(str(e), permanent=e.kind in ("missing", "denied")) from None


def data_client(data: DataConfig, storage: StorageConfig) -> S3Client:
    """A client for the dataset bucket: its own keys (or none, for a public bucket), never the node's."""
    key = data.access_key_id or os.environ.get(DATA_KEY_ENV, "")
    secret = data.secret_access_key or os.environ.get(DATA_SECRET_ENV, "")
    return S3Client(data.endpoint or storage.endpoint or None, data.region or storage.region, key, secret,
                    timeout=storage.timeout_seconds, max_attempts=DATA_ATTEMPTS, use_environment=False)


def cache_root(cache_dir: str, url: CorpusURL) -> Path:
    """Where the chunks of one corpus are cached (slots inside, one per process: dso.data.chunk_cache)."""
    name = hashlib.sha256(str(url).encode()).hexdigest()[:16]
    return expand(cache_dir) / "remote" / name


def open_remote(url: str, client: S3Client, cache_dir: str, cache_mb: float, sleep: Sleep = plain_sleep,
                first_delay: float = 1.0, max_delay: float = 30.0) -> ShardSet:
    """The shards at ``url``, read through a cache of at most ``cache_mb`` MB; an outage is retried after
    ``first_delay`` seconds, doubling up to ``max_delay``."""
    where = CorpusURL.parse(url)
    cache = ChunkCache(cache_root(cache_dir, where), int(cache_mb * 1e6))
    corpus = RemoteCorpus(S3Source(client, where), cache, sleep, first_delay=first_delay, max_delay=max_delay)
    return corpus.open()


def open_dataset(hp: HParams, data: DataConfig, storage: StorageConfig, sleep: Sleep = plain_sleep) -> Dataset:
    """The run's data as a node reads it: a local corpus (dso.data.dataset), or shards in a bucket, checked against
    ``hp.data_hash``.  Raises DataError (one line) when it is not the run's data or cannot be opened."""
    if not is_remote_corpus(data.corpus):
        return Dataset.for_run(hp, data.corpus, data.cache_dir, data.tokenizer_file)
    try:
        CorpusURL.parse(data.corpus)
    except ValueError as e:
        raise DataError(f"--data.corpus {e}") from None
    shards = open_remote(data.corpus, data_client(data, storage), data.cache_dir, data.cache_mb, sleep)
    return Dataset.from_shard_set(hp, shards, data.tokenizer_file)
