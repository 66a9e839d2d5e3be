"""Pre-tokenised data shards: writing them from a corpus, and reading them without loading them.

A shard folder holds ``shard-NNNNN.npy`` files (one flat array of token ids each, ``uint16`` when the
vocabulary fits, else ``uint32``), the BPE's ``tokenizer.json`` (none for bytes), and
``manifest.json``::

    {"format": "dso-shards", "version": 1, "dtype": "uint16",
     "tokenizer": {"kind": "bpe", "vocab_size": 1024, "hash": "…", "file": "tokenizer.json"},
     "shards": [{"file": "shard-00000.npy", "sha256": "…", "tokens": 33554432}, …],
     "documents": 38, "text_bytes": 5057198}

The manifest is written last, so a folder whose writing was interrupted is never mistaken for a
complete one.  :func:`open_shards` checks the manifest, every shard's sha256 (read in small chunks,
so checking does not grow the process's resident memory) and that no id exceeds the vocabulary,
then opens the shards for positioned reads (:class:`ShardFile`; no memory map, see there).  Any
mismatch is a :class:`DataError` naming the file.

The data hash nodes agree on (:func:`data_hash`) is 64 hex digits: the first 16 are the tokeniser's
hash, the other 48 a sha256 over the tokeniser and every shard's hash and size — so a node can say
whether it is the tokeniser or the text that differs from the run's.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, TypeGuard

import numpy as np
import numpy.typing as npt

from dso.atomic import atomic_write
from dso.corpus import DataError, iter_documents, total_bytes
from dso.tokenizer import Tokenizer

FORMAT, VERSION, MANIFEST = "dso-shards", 1, "manifest.json"
TOKENIZER_FILE = "tokenizer.json"
SHARD_TOKENS = 1 << 25          # ids per shard (64 MiB as uint16)
_SHARD_NAME = re.compile(r"shard-\d{5,}\.npy")
_HEX64 = re.compile(r"[0-9a-f]{64}")
HASH_CHUNK = 1 << 20  # bytes read per step when hashing: small, so checking adds little to the peak RSS


def dtype_for(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


@dataclass(frozen=True)
class ShardInfo:
    file: str
    sha256: str
    tokens: int


@dataclass
class Manifest:
    tokenizer_kind: str
    vocab_size: int
    tokenizer_hash: str
    dtype: str
    shards: list[ShardInfo]
    documents: int = 0
    text_bytes: int = 0

    def to_json(self) -> str:
        tok = {"kind": self.tokenizer_kind, "vocab_size": self.vocab_size, "hash": self.tokenizer_hash}
        if self.tokenizer_kind == "bpe":
            tok["file"] = TOKENIZER_FILE
        return json.dumps({"format": FORMAT, "version": VERSION, "dtype": self.dtype, "tokenizer": tok,
                           "shards": [vars(s) for s in self.shards], "documents": self.documents,
                           "text_bytes": self.text_bytes}, indent=1) + "\n"

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)


def data_hash(manifest: Manifest) -> str:
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


# ------------------------------------------------------------------ writing
Progress = Callable[[int], None]


def write_shards(files: list[Path], tokenizer: Tokenizer, out_dir: str | Path, shard_tokens: int = SHARD_TOKENS,
                 progress: Progress | None = None) -> Manifest:
    """Tokenise ``files`` into shards in ``out_dir`` (created; must not hold a manifest yet).

    Memory stays bounded by one shard's buffer plus one text piece, whatever the corpus size.
    ``progress`` is called with the input bytes consumed since its last call."""
    out = Path(out_dir).expanduser()
    if (out / MANIFEST).exists():
        raise DataError(f"{out} already holds a shard manifest; choose another --out or remove it")
    out.mkdir(parents=True, exist_ok=True)
    dtype = dtype_for(tokenizer.vocab_size)
    writer = _ShardWriter(out, dtype, shard_tokens)
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
                        total_bytes(files))
    atomic_write(out / MANIFEST, manifest.to_json().encode())
    return manifest


class _ShardWriter:
    def __init__(self, out: Path, dtype: np.dtype, shard_tokens: int):
        self.out, self.dtype, self.cap = out, dtype, shard_tokens
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
        self.shards.append(ShardInfo(name, file_sha256(self.out / name), int(self.used)))
        self.used = 0

    def close(self) -> list[ShardInfo]:
        self._flush()
        self.buf = np.empty(0, self.dtype)
        return self.shards


# ------------------------------------------------------------------ reading
def is_shard_corpus(corpus: str) -> bool:
    path = Path(corpus).expanduser()
    return path.name == MANIFEST and path.is_file() or path.is_dir() and (path / MANIFEST).is_file()


def read_manifest(folder: Path) -> Manifest:
    path = folder / MANIFEST
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise DataError(f"{path}: unreadable shard manifest ({e})") from None
    bad: Callable[[str], DataError] = lambda what: DataError(f"{path}: {what}")  # noqa: E731
    if not isinstance(obj, dict) or obj.get("format") != FORMAT or obj.get("version") != VERSION:
        raise bad(f"not a {FORMAT} v{VERSION} manifest")
    tok, shards = obj.get("tokenizer"), obj.get("shards")
    if not isinstance(tok, dict) or tok.get("kind") not in ("bytes", "bpe") or not _is_int(tok.get("vocab_size")) \
            or not isinstance(tok.get("hash"), str) or not _HEX64.fullmatch(tok["hash"]):
        raise bad("tokenizer entry must have kind (bytes|bpe), vocab_size and a sha256 hash")
    vocab = tok["vocab_size"]
    if not 0 < vocab <= 1 << 32 or obj.get("dtype") != dtype_for(vocab).name:
        raise bad(f"dtype {obj.get('dtype')!r} does not suit a vocabulary of {vocab}")
    if not isinstance(shards, list) or not shards:
        raise bad("no shards listed")
    infos = []
    for i, s in enumerate(shards):
        if not isinstance(s, dict) or not isinstance(s.get("file"), str) or not _SHARD_NAME.fullmatch(s["file"]) \
                or not isinstance(s.get("sha256"), str) or not _HEX64.fullmatch(s["sha256"]) \
                or not _is_int(s.get("tokens")) or s["tokens"] <= 0:
            raise bad(f"shard entry {i} needs file (shard-NNNNN.npy), sha256 and a positive token count")
        infos.append(ShardInfo(s["file"], s["sha256"], s["tokens"]))
    if len({s.file for s in infos}) != len(infos):
        raise bad("a shard file is listed twice")
    return Manifest(tok["kind"], vocab, tok["hash"], obj["dtype"], infos, _int_or0(obj.get("documents")),
                    _int_or0(obj.get("text_bytes")))


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_or0(v: object) -> int:
    return v if _is_int(v) and v >= 0 else 0


class ShardFile:
    """A shard's ids, read on demand with positioned reads: ``shard[a:b]`` reads just those ids.

    Not a memory map on purpose: the kernel maps a file's page-cache folios whole (up to 2 MiB here),
    so each random sequence read through ``np.memmap`` added about 1 MiB to the resident set, and a
    miner's peak RSS grew with the corpus (docs/data.md).  Positioned reads leave nothing mapped."""

    def __init__(self, path: Path, dtype: np.dtype, length: int, data_offset: int):
        self.path, self.dtype, self.shape, self.offset = path, dtype, (length,), data_offset

    @classmethod
    def open(cls, path: Path) -> "ShardFile":
        try:
            with open(path, "rb") as fh:
                version = np.lib.format.read_magic(fh)
                if version not in ((1, 0), (2, 0)):
                    raise ValueError(f"unsupported .npy version {version}")
                shape, fortran, dtype = (np.lib.format.read_array_header_1_0(fh) if version == (1, 0)
                                         else np.lib.format.read_array_header_2_0(fh))
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
    folder: Path
    manifest: Manifest
    tokenizer: Tokenizer
    arrays: list[ShardFile]

    @property
    def data_hash(self) -> str:
        return data_hash(self.manifest)


def open_shards(corpus: str | Path, verify: bool = True) -> ShardSet:
    """Open a shard folder (or its manifest.json): validated, hashes checked, shards ready to read."""
    folder = Path(corpus).expanduser()
    folder = folder.parent if folder.name == MANIFEST else folder
    manifest = read_manifest(folder)
    tokenizer = _manifest_tokenizer(folder, manifest)
    arrays = []
    for s in manifest.shards:
        path = folder / s.file
        if verify:
            _verify_shard(path, s, manifest.vocab_size)
        arr = ShardFile.open(path)
        if arr.dtype != np.dtype(manifest.dtype) or arr.shape != (s.tokens,):
            raise DataError(f"{path}: holds {arr.dtype}{list(arr.shape)}, "
                            f"the manifest says {manifest.dtype}[{s.tokens}]")
        arrays.append(arr)
    return ShardSet(folder, manifest, tokenizer, arrays)


def _manifest_tokenizer(folder: Path, manifest: Manifest) -> Tokenizer:
    if manifest.tokenizer_kind == "bytes":
        tok = Tokenizer.bytes()
    else:
        tok = Tokenizer.from_file(folder / TOKENIZER_FILE)
    if tok.hash != manifest.tokenizer_hash or tok.vocab_size != manifest.vocab_size:
        raise DataError(f"{folder / (TOKENIZER_FILE if manifest.tokenizer_kind == 'bpe' else MANIFEST)}: the "
                        f"tokeniser ({tok.describe()}) differs from the one the manifest names "
                        f"({manifest.tokenizer_hash[:12]}…, {manifest.vocab_size} ids)")
    return tok


def _verify_shard(path: Path, info: ShardInfo, vocab_size: int) -> None:
    """sha256 against the manifest, and every id below the vocabulary size: one pass of plain reads."""
    try:
        digest, top = _hash_and_max(path)
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: cannot read shard ({e})") from None
    if digest != info.sha256:
        raise DataError(f"{path}: sha256 {digest[:16]}… differs from the manifest's {info.sha256[:16]}…: "
                        "the shard was changed or damaged; re-run scripts/prepare_data.py")
    if top >= vocab_size:
        raise DataError(f"{path}: holds token id {top}, outside the vocabulary of {vocab_size}")


def _hash_and_max(path: Path) -> tuple[str, int]:
    h, top = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        version = np.lib.format.read_magic(fh)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                       (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read_header is None:
            raise ValueError(f"unsupported .npy version {version}")
        _, _, dtype = read_header(fh)
        data_start = fh.tell()
        fh.seek(0)
        h.update(fh.read(data_start))
        buf = bytearray(HASH_CHUNK)
        while n := fh.readinto(buf):          # HASH_CHUNK is a multiple of every item size
            view = memoryview(buf)[:n]
            h.update(view)
            ids = np.frombuffer(view[: n - n % dtype.itemsize], dtype=dtype)
            if ids.size:
                top = max(top, int(ids.max()))
    return h.hexdigest(), top


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
