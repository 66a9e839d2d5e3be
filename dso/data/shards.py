"""Pre-tokenised data shards: the manifest, the data hash, and reading a shard folder without loading it.

A shard folder holds ``shard-NNNNN.npy`` files (one flat array of token ids each, ``uint16`` when the
vocabulary fits, else ``uint32``), for each a ``shard-NNNNN.chunks`` file (the sha256 digests of its
consecutive ``chunk_bytes`` pieces, 32 bytes each), the BPE's ``tokenizer.json`` (none for bytes), and
``manifest.json``::

    {"format": "dso-shards", "version": 2, "dtype": "uint16", "chunk_bytes": 65536,
     "tokenizer": {"kind": "bpe", "vocab_size": 1024, "hash": "…", "file": "tokenizer.json"},
     "shards": [{"file": "shard-00000.npy", "sha256": "…", "tokens": 33554432, "chunks_sha256": "…"}, …],
     "documents": 38, "text_bytes": 5057198}

The chunk digests let a node that reads a shard piece by piece from an object store check every piece
on its own (:mod:`dso.data.remote_shards`); ``chunks_sha256`` (the sha256 of the ``.chunks`` file) binds them
to the manifest.  Version-1 manifests (no chunk digests) are still read from a local folder.

The manifest is written last (:mod:`dso.data.shard_writer`), so a folder whose writing was interrupted is
never mistaken for a complete one.  :func:`open_shards` checks the manifest, every shard's sha256 and
chunk digests (one pass of small reads, so checking does not grow the process's resident memory) and
that no id exceeds the vocabulary, then opens the shards for positioned reads (:class:`ShardFile`; no
memory map, see there).  Any mismatch is a :class:`DataError` naming the file.

The data hash nodes agree on (:func:`data_hash`) is 64 hex digits: the first 16 are the tokeniser's
hash, the other 48 a sha256 over everything else the manifest says about the tokens (dtype, chunk size,
every shard's hash, size and chunk digests) — so it is the manifest's hash, and a node can say whether
it is the tokeniser or the text that differs from the run's.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

import numpy as np
import numpy.typing as npt

from dso.data.corpus import DataError
from dso.data.tokenizer import Tokenizer, TokenizerKind

FORMAT, VERSION, MANIFEST = "dso-shards", 2, "manifest.json"
READABLE_VERSIONS = (1, 2)
TOKENIZER_FILE = "tokenizer.json"
SHARD_TOKENS = 1 << 25          # ids per shard (64 MiB as uint16)
CHUNK_BYTES = 1 << 16           # bytes per verified piece of a shard (docs/decisions/0500-chunked-remote-shards.md)
MIN_CHUNK_BYTES, MAX_CHUNK_BYTES = 1 << 12, 1 << 26
DIGEST = 32                     # bytes per chunk digest (sha256)
_SHARD_NAME = re.compile(r"shard-\d{5,}\.npy")
_HEX64 = re.compile(r"[0-9a-f]{64}")
HASH_CHUNK = 1 << 20  # bytes read per step when hashing: small, so checking adds little to the peak RSS


def dtype_for(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def chunks_name(shard_file: str) -> str:
    """``shard-00003.npy`` → ``shard-00003.chunks``: the file of that shard's chunk digests."""
    return shard_file[:-len(".npy")] + ".chunks"


@dataclass(frozen=True)
class ShardInfo:
    file: str
    sha256: str
    tokens: int
    chunks_sha256: str = ""   # sha256 of the shard's .chunks file ("" in a version-1 manifest)


@dataclass
class Manifest:
    tokenizer_kind: TokenizerKind
    vocab_size: int
    tokenizer_hash: str
    dtype: str
    shards: list[ShardInfo]
    documents: int = 0
    text_bytes: int = 0
    chunk_bytes: int = 0      # 0: a version-1 manifest, without chunk digests

    def to_json(self) -> str:
        tok = {"kind": self.tokenizer_kind, "vocab_size": self.vocab_size, "hash": self.tokenizer_hash}
        if self.tokenizer_kind == "bpe":
            tok["file"] = TOKENIZER_FILE
        version = VERSION if self.chunk_bytes else 1
        head: dict[str, object] = {"format": FORMAT, "version": version, "dtype": self.dtype}
        if self.chunk_bytes:
            head["chunk_bytes"] = self.chunk_bytes
        shards = [{k: v for k, v in vars(s).items() if v != "" or k != "chunks_sha256"} for s in self.shards]
        return json.dumps({**head, "tokenizer": tok, "shards": shards, "documents": self.documents,
                           "text_bytes": self.text_bytes}, indent=1) + "\n"

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)


def data_hash(manifest: Manifest) -> str:
    if manifest.chunk_bytes:
        h = hashlib.sha256(f"dso-data-v3|{manifest.tokenizer_hash}|{manifest.dtype}|{manifest.chunk_bytes}".encode())
        for s in manifest.shards:
            h.update(f"|{s.sha256}:{s.tokens}:{s.chunks_sha256}".encode())
    else:  # version 1: the hash such folders always had
        h = hashlib.sha256(f"dso-data-v2|{manifest.tokenizer_hash}|{manifest.dtype}".encode())
        for s in manifest.shards:
            h.update(f"|{s.sha256}:{s.tokens}".encode())
    return manifest.tokenizer_hash[:16] + h.hexdigest()[:48]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(HASH_CHUNK):
            h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------ one pass over a shard
class ChunkDigests:
    """sha256 digests of consecutive ``size``-byte pieces of a byte stream fed in any slices."""

    def __init__(self, size: int):
        self.size, self._digests, self._h, self._filled = size, bytearray(), hashlib.sha256(), 0

    def update(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while len(view):
            take = min(len(view), self.size - self._filled)
            self._h.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == self.size:
                self._digests += self._h.digest()
                self._h, self._filled = hashlib.sha256(), 0

    def finish(self) -> bytes:
        if self._filled:
            self._digests += self._h.digest()
            self._h, self._filled = hashlib.sha256(), 0
        return bytes(self._digests)


def chunk_digests(data: bytes, size: int) -> bytes:
    digests = ChunkDigests(size)
    digests.update(data)
    return digests.finish()


@dataclass(frozen=True)
class ShardScan:
    sha256: str
    max_id: int
    chunks: bytes   # the chunk digests (empty when no chunk size was asked for)

    @property
    def chunks_sha256(self) -> str:
        return hashlib.sha256(self.chunks).hexdigest() if self.chunks else ""


def npy_header(fh: io.BufferedIOBase | io.BytesIO) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran order, dtype) of a .npy stream positioned at its start; ValueError if it is not one."""
    version = np.lib.format.read_magic(fh)
    read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                   (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read_header is None:
        raise ValueError(f"unsupported .npy version {version}")
    shape, fortran, dtype = read_header(fh)
    return shape, fortran, dtype


def scan_shard(path: Path, chunk_bytes: int = 0) -> ShardScan:
    """The shard's sha256, its largest id and (with ``chunk_bytes``) its chunk digests, in one pass of
    plain ``HASH_CHUNK`` reads."""
    h, top = hashlib.sha256(), 0
    pieces = ChunkDigests(chunk_bytes) if chunk_bytes else None
    with open(path, "rb") as fh:
        _, _, dtype = npy_header(fh)
        data_start = fh.tell()
        fh.seek(0)
        header = fh.read(data_start)
        h.update(header)
        if pieces:
            pieces.update(header)
        buf = bytearray(HASH_CHUNK)
        while n := fh.readinto(buf):          # HASH_CHUNK is a multiple of every item size
            view = memoryview(buf)[:n]
            h.update(view)
            if pieces:
                pieces.update(view)
            ids = np.frombuffer(view[: n - n % dtype.itemsize], dtype=dtype)
            if ids.size:
                top = max(top, int(ids.max()))
    return ShardScan(h.hexdigest(), top, pieces.finish() if pieces else b"")


# ------------------------------------------------------------------ the manifest
def is_shard_corpus(corpus: str) -> bool:
    path = Path(corpus).expanduser()
    return path.name == MANIFEST and path.is_file() or path.is_dir() and (path / MANIFEST).is_file()


def read_manifest(folder: Path) -> Manifest:
    path = folder / MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: unreadable shard manifest ({e})") from None
    return parse_manifest(text, str(path))


def parse_manifest(text: str | bytes, source: str) -> Manifest:
    """A manifest from its JSON; :class:`DataError` naming ``source`` and what is wrong."""
    try:
        obj = json.loads(text)
    except (UnicodeDecodeError, ValueError) as e:
        raise DataError(f"{source}: unreadable shard manifest ({e})") from None
    bad: Callable[[str], DataError] = lambda what: DataError(f"{source}: {what}")  # noqa: E731
    if not isinstance(obj, dict) or obj.get("format") != FORMAT or obj.get("version") not in READABLE_VERSIONS:
        raise bad(f"not a {FORMAT} manifest of version {' or '.join(map(str, READABLE_VERSIONS))}")
    tok, shards = obj.get("tokenizer"), obj.get("shards")
    if not isinstance(tok, dict) or tok.get("kind") not in ("bytes", "bpe") or not _is_int(tok.get("vocab_size")) \
            or not isinstance(tok.get("hash"), str) or not _HEX64.fullmatch(tok["hash"]):
        raise bad("tokenizer entry must have kind (bytes|bpe), vocab_size and a sha256 hash")
    vocab = tok["vocab_size"]
    if not 0 < vocab <= 1 << 32 or obj.get("dtype") != dtype_for(vocab).name:
        raise bad(f"dtype {obj.get('dtype')!r} does not suit a vocabulary of {vocab}")
    chunk_bytes = 0
    if obj["version"] >= 2:
        given = obj.get("chunk_bytes")
        if not _is_int(given) or not MIN_CHUNK_BYTES <= given <= MAX_CHUNK_BYTES or given % 64:
            raise bad(f"chunk_bytes must be a multiple of 64 from {MIN_CHUNK_BYTES} to {MAX_CHUNK_BYTES}")
        chunk_bytes = given
    if not isinstance(shards, list) or not shards:
        raise bad("no shards listed")
    infos = [_shard_entry(s, i, chunk_bytes > 0, bad) for i, s in enumerate(shards)]
    if len({s.file for s in infos}) != len(infos):
        raise bad("a shard file is listed twice")
    return Manifest(tok["kind"], vocab, tok["hash"], obj["dtype"], infos, _int_or0(obj.get("documents")),
                    _int_or0(obj.get("text_bytes")), chunk_bytes)


def _shard_entry(s: object, i: int, chunked: bool, bad: Callable[[str], DataError]) -> ShardInfo:
    if not isinstance(s, dict) or not isinstance(s.get("file"), str) or not _SHARD_NAME.fullmatch(s["file"]) \
            or not isinstance(s.get("sha256"), str) or not _HEX64.fullmatch(s["sha256"]) \
            or not _is_int(s.get("tokens")) or s["tokens"] <= 0:
        raise bad(f"shard entry {i} needs file (shard-NNNNN.npy), sha256 and a positive token count")
    if chunked and not (isinstance(s.get("chunks_sha256"), str) and _HEX64.fullmatch(s["chunks_sha256"])):
        raise bad(f"shard entry {i} needs chunks_sha256 (the sha256 of its chunk digests)")
    return ShardInfo(s["file"], s["sha256"], s["tokens"], s["chunks_sha256"] if chunked else "")


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_or0(v: object) -> int:
    return v if _is_int(v) and v >= 0 else 0


def manifest_tokenizer(manifest: Manifest, tokenizer_json: Callable[[], str] | None, where: str) -> Tokenizer:
    """The tokeniser the manifest names: bytes, or the BPE in ``tokenizer_json()`` (read only for a BPE),
    checked against the manifest's hash and size; ``where`` names the tokeniser's file in messages."""
    if manifest.tokenizer_kind == "bytes":
        tok = Tokenizer.bytes()
    else:
        if tokenizer_json is None:
            raise DataError(f"{where}: a BPE corpus needs its tokenizer.json")
        tok = Tokenizer.from_json(tokenizer_json(), where)
    if tok.hash != manifest.tokenizer_hash or tok.vocab_size != manifest.vocab_size:
        raise DataError(f"{where}: the tokeniser ({tok.describe()}) differs from the one the manifest names "
                        f"({manifest.tokenizer_hash[:12]}…, {manifest.vocab_size} ids)")
    return tok


# ------------------------------------------------------------------ reading a local folder
class TokenArray:
    """What :class:`dso.data.dataset.Dataset` reads: a flat id array of ``shape`` and ``dtype``, sliced contiguously.
    An array that reads from far away also has ``prefetch(spans, urgent)`` (:mod:`dso.data.remote_shards`)."""

    shape: tuple[int]
    dtype: np.dtype

    def __getitem__(self, index: slice) -> np.ndarray:
        raise NotImplementedError


class ShardFile(TokenArray):
    """A shard's ids, read on demand with positioned reads: ``shard[a:b]`` reads just those ids.

    Not a memory map on purpose: the kernel maps a file's page-cache folios whole (up to 2 MiB here),
    so each random sequence read through ``np.memmap`` added about 1 MiB to the resident set, and a
    miner's peak RSS grew with the corpus (docs/data.md).  Positioned reads leave nothing mapped."""

    def __init__(self, path: Path, dtype: np.dtype, length: int, data_offset: int):
        self.path, self.dtype, self.shape, self.offset = path, dtype, (length,), data_offset

    @classmethod
    def open(cls, path: Path) -> ShardFile:
        try:
            with open(path, "rb") as fh:
                shape, fortran, dtype = npy_header(fh)
                offset = fh.tell()
                size = fh.seek(0, os.SEEK_END)
        except (OSError, ValueError) as e:
            raise DataError(f"{path}: not a readable .npy shard ({e})") from None
        if len(shape) != 1 or dtype not in (np.dtype(np.uint16), np.dtype(np.uint32)) or \
                size != offset + shape[0] * dtype.itemsize:
            raise DataError(f"{path}: expected a flat uint16/uint32 array filling the file, got {dtype}{list(shape)}")
        return cls(path, dtype, int(shape[0]), offset)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: slice) -> np.ndarray:
        start, stop, step = index.indices(self.shape[0]) if isinstance(index, slice) else (None, None, None)
        if step != 1:
            raise TypeError("ShardFile supports contiguous slices only")
        count = max(0, stop - start)
        with open(self.path, "rb") as fh:
            data = os.pread(fh.fileno(), count * self.dtype.itemsize, self.offset + start * self.dtype.itemsize)
        if len(data) != count * self.dtype.itemsize:
            raise DataError(f"{self.path}: shorter than its header says (truncated while in use?)")
        return np.frombuffer(data, dtype=self.dtype)

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        out = self[0:self.shape[0]]
        return out.astype(dtype) if dtype is not None else out


@dataclass
class ShardSet:
    """A corpus's shards, ready to read: ``origin`` names where they are (a folder, or an s3:// URL)."""
    origin: str
    manifest: Manifest
    tokenizer: Tokenizer
    arrays: Sequence[TokenArray]

    @property
    def data_hash(self) -> str:
        return data_hash(self.manifest)

    @property
    def folder(self) -> Path:
        """The local folder (a remote set has none: asking is a programming error)."""
        if "://" in self.origin:
            raise ValueError(f"{self.origin} is not a local folder")
        return Path(self.origin)


def open_shards(corpus: str | Path, verify: bool = True) -> ShardSet:
    """Open a shard folder (or its manifest.json): validated, hashes checked, shards ready to read."""
    folder = Path(corpus).expanduser()
    folder = folder.parent if folder.name == MANIFEST else folder
    manifest = read_manifest(folder)
    tok_path = folder / (TOKENIZER_FILE if manifest.tokenizer_kind == "bpe" else MANIFEST)
    tokenizer = manifest_tokenizer(manifest, lambda: _read_text(tok_path), str(tok_path))
    arrays = []
    for s in manifest.shards:
        path = folder / s.file
        if verify:
            verify_shard(path, s, manifest)
        arr = ShardFile.open(path)
        if arr.dtype != np.dtype(manifest.dtype) or arr.shape != (s.tokens,):
            raise DataError(f"{path}: holds {arr.dtype}{list(arr.shape)}, "
                            f"the manifest says {manifest.dtype}[{s.tokens}]")
        arrays.append(arr)
    return ShardSet(str(folder), manifest, tokenizer, arrays)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"tokenizer file {path}: cannot read ({e})") from None


def verify_shard(path: Path, info: ShardInfo, manifest: Manifest) -> ShardScan:
    """sha256 and chunk digests against the manifest, and every id below the vocabulary size: one pass."""
    try:
        scan = scan_shard(path, manifest.chunk_bytes)
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: cannot read shard ({e})") from None
    if scan.sha256 != info.sha256:
        raise DataError(f"{path}: sha256 {scan.sha256[:16]}… differs from the manifest's {info.sha256[:16]}…: "
                        "the shard was changed or damaged; re-run scripts/prepare_data.py")
    if scan.chunks_sha256 != info.chunks_sha256:
        raise DataError(f"{path}: its chunk digests hash to {scan.chunks_sha256[:16]}…, the manifest says "
                        f"{info.chunks_sha256[:16]}…: the manifest was changed; re-run scripts/prepare_data.py")
    if scan.max_id >= manifest.vocab_size:
        raise DataError(f"{path}: holds token id {scan.max_id}, outside the vocabulary of {manifest.vocab_size}")
    return scan
