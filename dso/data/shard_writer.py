"""Writing shard folders: a corpus tokenised into ``shard-NNNNN.npy`` files, their chunk digests and the
manifest (written last), with memory bounded by one shard's buffer whatever the corpus size; and the cache
of shards a node builds from a text corpus on first use.  The format is :mod:`dso.data.shards`'s."""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from dso.data.corpus import DataError, iter_documents, total_bytes
from dso.data.shards import (
    CHUNK_BYTES,
    MANIFEST,
    MAX_CHUNK_BYTES,
    MIN_CHUNK_BYTES,
    SHARD_TOKENS,
    TOKENIZER_FILE,
    Manifest,
    ShardInfo,
    ShardSet,
    chunks_name,
    dtype_for,
    open_shards,
    scan_shard,
)
from dso.data.tokenizer import Tokenizer
from dso.util.atomic import atomic_write

Progress = Callable[[int], None]


def write_shards(files: list[Path], tokenizer: Tokenizer, out_dir: str | Path, shard_tokens: int = SHARD_TOKENS,
                 progress: Progress | None = None, chunk_bytes: int = CHUNK_BYTES) -> Manifest:
    """Tokenise ``files`` into shards in ``out_dir`` (created; must not hold a manifest yet).

    Memory stays bounded by one shard's buffer plus one text piece, whatever the corpus size.
    ``progress`` is called with the input bytes consumed since its last call."""
    out = Path(out_dir).expanduser()
    if (out / MANIFEST).exists():
        raise DataError(f"{out} already holds a shard manifest; choose another --out or remove it")
    if not MIN_CHUNK_BYTES <= chunk_bytes <= MAX_CHUNK_BYTES or chunk_bytes % 64:
        raise DataError(f"chunk size {chunk_bytes}: a multiple of 64 from {MIN_CHUNK_BYTES} to {MAX_CHUNK_BYTES}")
    out.mkdir(parents=True, exist_ok=True)
    dtype = dtype_for(tokenizer.vocab_size)
    writer = ShardWriter(out, dtype, shard_tokens, chunk_bytes)
    documents = 0
    for piece in iter_documents(files):
        if piece.text:
            writer.add(tokenizer.encode_long(piece.text).astype(dtype))
        documents += piece.end
        if progress and piece.nbytes:
            progress(piece.nbytes)
    shards = writer.close()
    if not shards:
        raise DataError(f"corpus ({len(files)} files) produced no tokens")
    if tokenizer.kind == "bpe":
        tokenizer.save(out / TOKENIZER_FILE)
    manifest = Manifest(tokenizer.kind, tokenizer.vocab_size, tokenizer.hash, dtype.name, shards, documents,
                        total_bytes(files), chunk_bytes)
    atomic_write(out / MANIFEST, manifest.to_json().encode())
    return manifest


class ShardWriter:
    """Ids in, full shards out: each shard (and its chunk digests) is written and hashed when it fills."""

    def __init__(self, out: Path, dtype: np.dtype, shard_tokens: int, chunk_bytes: int = CHUNK_BYTES):
        self.out, self.dtype, self.cap, self.chunk_bytes = out, dtype, shard_tokens, chunk_bytes
        self.buf = np.empty(shard_tokens, dtype)
        self.used = 0
        self.shards: list[ShardInfo] = []

    def add(self, ids: np.ndarray) -> None:
        while ids.size:
            take = min(ids.size, self.cap - self.used)
            self.buf[self.used:self.used + take] = ids[:take]
            self.used += take
            ids = ids[take:]
            if self.used == self.cap:
                self._flush()

    def _flush(self) -> None:
        if not self.used:
            return
        name = f"shard-{len(self.shards):05d}.npy"
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=self.out)
        with os.fdopen(fd, "wb") as fh:
            np.save(fh, self.buf[:self.used], allow_pickle=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.out / name)
        scan = scan_shard(self.out / name, self.chunk_bytes)
        atomic_write(self.out / chunks_name(name), scan.chunks)
        self.shards.append(ShardInfo(name, scan.sha256, int(self.used), scan.chunks_sha256))
        self.used = 0

    def close(self) -> list[ShardInfo]:
        self._flush()
        self.buf = np.empty(0, self.dtype)
        return self.shards


# ------------------------------------------------------------------ corpus → cached shards
def prepared_shards(files: list[Path], tokenizer: Tokenizer, cache_root: Path, key: str,
                    progress: Progress | None = None) -> ShardSet:
    """Shards of a text corpus under ``cache_root/shards-<key>``, written on first use, reused after."""
    folder = cache_root / f"shards-{key}"
    if (folder / MANIFEST).is_file():
        try:
            shards = open_shards(folder)
            if shards.manifest.tokenizer_hash == tokenizer.hash:
                return shards
        except DataError:
            pass  # a damaged cache is rebuilt below
        shutil.rmtree(folder, ignore_errors=True)
    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".shards-{key}.", dir=cache_root))
    try:
        write_shards(files, tokenizer, tmp, progress=progress)
        try:
            os.replace(tmp, folder)
        except OSError:   # another process of this machine finished first: use its copy
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return open_shards(folder)


def iter_all_text(files: Iterable[Path]) -> Iterable[str]:
    return (p.text for p in iter_documents(files) if p.text)
