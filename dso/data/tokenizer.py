"""Tokenisers: raw bytes, or a byte-level BPE built with the `tokenizers` library.

* ``bytes``: 256 ids, id = byte value.  Nothing to train or ship.
* ``bpe``: GPT-2-style byte-level BPE (pre-tokeniser ``ByteLevel`` with its split regex, no special
  tokens).  Trained from the corpus on first use — the trainer has no randomness and its tie-breaks
  are by token id, so the same text and settings give a byte-identical ``tokenizer.json`` on every
  node — or loaded from a ``tokenizer.json`` the operator passes (it must be byte-level: every
  vocabulary entry spells bytes in the ByteLevel alphabet, so each token's byte length is exact and
  bits per byte are too).

:attr:`Tokenizer.hash` names the tokeniser in the data hash nodes agree on.  For BPE it hashes a
canonical form (vocabulary, merges, normaliser, pre-tokeniser, added tokens) rather than the file's
bytes, so a different serialisation of the same tokeniser by another library version still agrees.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from dso.data.corpus import DataError

if TYPE_CHECKING:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    from dso.config.schema import Config

BYTES_ID = "bytes-v1"
TRAIN_CAP_BYTES = 64 << 20    # BPE learns its merges from at most this much text (the corpus's start)
MIN_FREQUENCY = 2             # a pair must occur this often to become a merge
BATCH_CHARS = 1 << 16         # text is encoded in batches of lines of about this size


def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map, as the ByteLevel pre-tokeniser uses it:
    printable Latin-1 bytes stand for themselves, the others get the characters from U+0100 on."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def _pre_tokenizer() -> pre_tokenizers.ByteLevel:
    from tokenizers import pre_tokenizers
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _assemble(model: models.Model) -> HFTokenizer:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders
    tok = HFTokenizer(model)
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    return tok


TokenizerKind = Literal["bytes", "bpe"]


class Tokenizer:
    """One tokeniser: ``kind`` is ``bytes`` or ``bpe``; ids are 0 … vocab_size - 1."""

    def __init__(self, kind: TokenizerKind, hf: HFTokenizer | None = None) -> None:
        if kind not in ("bytes", "bpe"):
            raise ValueError(f"unknown tokenizer kind {kind!r}")
        if (hf is None) != (kind == "bytes"):  # so below, hf is None exactly for bytes
            raise ValueError(f"a {kind} tokenizer {'takes no' if hf is not None else 'needs its'} tokenizers object")
        self.kind, self._hf = kind, hf
        self.vocab_size = 256 if hf is None else hf.get_vocab_size(with_added_tokens=True)
        self.hash = (hashlib.sha256(BYTES_ID.encode()).hexdigest() if hf is None
                     else canonical_hash(hf.to_str()))
        self.token_bytes = np.ones(256, np.int64) if hf is None else _token_byte_lengths(hf)

    # -------------------------------------------------------------- build
    @classmethod
    def bytes(cls) -> Tokenizer:
        return cls("bytes")

    @classmethod
    def from_json(cls, text: str, source: str = "tokenizer.json") -> Tokenizer:
        """A byte-level tokeniser from its ``tokenizers`` JSON; anything else is refused, naming ``source``."""
        from tokenizers import Tokenizer as HFTokenizer
        try:
            hf = HFTokenizer.from_str(text)
        except Exception as e:  # noqa: BLE001 — the library raises plain Exceptions for bad JSON
            raise DataError(f"{source}: not a tokenizers JSON file ({str(e)[:160]})") from None
        problem = _not_byte_level(json.loads(text))
        if problem:
            raise DataError(f"{source}: tokenizer is not byte-level ({problem}); train one with "
                            "scripts/prepare_data.py --tokenizer bpe, or use --hparams.tokenizer bytes")
        try:
            return cls("bpe", hf)
        except DataError as e:
            raise DataError(f"{source}: {e}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        path = Path(path).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"tokenizer file {path}: cannot read ({e})") from None
        return cls.from_json(text, str(path))

    # -------------------------------------------------------------- use
    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` (int64)."""
        return self.encode_many([text])[0]

    def encode_many(self, texts: Sequence[str]) -> list[np.ndarray]:
        if self._hf is None:  # bytes
            return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int64) for t in texts]
        return [np.asarray(e.ids, dtype=np.int64) for e in self._hf.encode_batch(list(texts), add_special_tokens=False)]

    def encode_long(self, text: str) -> np.ndarray:
        """Ids of a long text, encoded in batches of whole lines (a fixed cut, so every node agrees)."""
        if self.kind == "bytes" or len(text) <= BATCH_CHARS:
            return self.encode(text)
        return np.concatenate(self.encode_many(list(_line_batches(text))))

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]
        if self._hf is None:  # bytes
            return bytes(ids).decode("utf-8", errors="replace")
        return self._hf.decode(ids, skip_special_tokens=False)

    def to_json(self) -> str:
        """The `tokenizers` JSON (for ``bytes`` an equivalent BPE with no merges: id = byte value)."""
        return (self._hf or bytes_as_hf()).to_str(pretty=True)

    def save(self, path: str | Path) -> None:
        from dso.util.atomic import atomic_write
        atomic_write(Path(path), self.to_json().encode())

    def describe(self) -> str:
        return f"{self.kind} ({self.vocab_size} ids, {self.hash[:12]}…)"


def _line_batches(text: str) -> Iterator[str]:
    start = 0
    while start < len(text):
        end = text.find("\n", start + BATCH_CHARS)
        end = len(text) if end < 0 else end + 1
        yield text[start:end]
        start = end


def bytes_as_hf() -> HFTokenizer:
    """The byte tokeniser as a `tokenizers` object (for export): ByteLevel BPE without merges."""
    from tokenizers import models
    alphabet = byte_alphabet()
    return _assemble(models.BPE(vocab={alphabet[b]: b for b in range(256)}, merges=[]))


def canonical_hash(tokenizer_json: str) -> str:
    """sha256 of what decides the ids: vocabulary, merges, normaliser, pre-tokeniser, added tokens."""
    obj = json.loads(tokenizer_json)
    model = obj.get("model") or {}
    merges = [m.split(" ", 1) if isinstance(m, str) else list(m) for m in model.get("merges") or []]
    added = sorted((t.get("id"), t.get("content"), bool(t.get("special"))) for t in obj.get("added_tokens") or [])
    canon = {"type": model.get("type"), "vocab": model.get("vocab"), "merges": merges,
             "normalizer": obj.get("normalizer"), "pre_tokenizer": obj.get("pre_tokenizer"), "added": added}
    return hashlib.sha256(json.dumps(canon, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _not_byte_level(obj: dict[str, Any]) -> str:
    """Why a tokenizers JSON is not a byte-level BPE whose tokens spell exactly the input's bytes ('' if it is)."""
    model, pre = obj.get("model") or {}, obj.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if model.get("type") != "BPE":
        return f"model {model.get('type')!r}, not BPE"
    if not any(isinstance(s, dict) and s.get("type") == "ByteLevel" for s in steps):
        return "no ByteLevel pre-tokeniser"
    if obj.get("normalizer"):
        return "a normaliser changes the text before it is split"
    missing = set(byte_alphabet().values()) - set(model.get("vocab") or {})
    if missing:
        return f"{len(missing)} of the 256 byte symbols are not in the vocabulary"
    return ""


def _token_byte_lengths(hf: HFTokenizer) -> np.ndarray:
    """Bytes each id decodes to; refuses tokenisers whose tokens are not byte-level strings."""
    size = hf.get_vocab_size(with_added_tokens=True)
    vocab = hf.get_vocab(with_added_tokens=True)
    if sorted(vocab.values()) != list(range(size)):
        raise DataError("tokenizer ids are not contiguous 0 … vocab_size - 1")
    special = {t.content for t in hf.get_added_tokens_decoder().values()}
    alphabet = set(byte_alphabet().values())
    lengths = np.zeros(size, np.int64)
    for token, i in vocab.items():
        if token in special:
            continue  # an added (special) token stands for no text
        if not token or any(ch not in alphabet for ch in token):
            raise DataError(f"tokenizer is not byte-level: token {token[:20]!r} (id {i}) is not spelled in the "
                            "ByteLevel alphabet")
        lengths[i] = len(token)
    return lengths


def train_bpe(texts: Iterable[str], vocab_size: int, cap_bytes: int = TRAIN_CAP_BYTES) -> Tokenizer:
    """Byte-level BPE of ``vocab_size`` ids learnt from the first ``cap_bytes`` of ``texts``."""
    from tokenizers import models, trainers
    if vocab_size <= 256:
        raise DataError(f"a BPE vocabulary needs more than the 256 byte ids, got {vocab_size}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    tok = _assemble(models.BPE())
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=MIN_FREQUENCY, show_progress=False,
                                  initial_alphabet=sorted(byte_alphabet().values()), special_tokens=[])
    tok.train_from_iterator(_capped(texts, cap_bytes), trainer)
    learnt = tok.get_vocab_size(with_added_tokens=True)
    if learnt != vocab_size:
        raise DataError(f"the corpus is too small to learn a {vocab_size}-token BPE (it stopped at {learnt} "
                        f"tokens); lower hparams.model.vocab_size or use hparams.tokenizer=bytes")
    return Tokenizer("bpe", tok)


def _capped(texts: Iterable[str], cap: int) -> Iterator[str]:
    used = 0
    for text in texts:
        if used >= cap:
            return
        if not text:
            continue
        text = text[: cap - used] if used + len(text) > cap else text
        used += len(text)
        yield from _line_batches(text)


@dataclass(frozen=True)
class TokenizerSpec:
    """What a run asks for: ``hparams.tokenizer``, ``hparams.model.vocab_size`` and the node's
    optional ``data.tokenizer_file`` (a BPE loaded instead of trained)."""
    kind: TokenizerKind = "bytes"
    vocab_size: int = 256
    file: str = ""

    @classmethod
    def from_config(cls, cfg: Config) -> TokenizerSpec:
        return cls(cfg.hparams.tokenizer, cfg.hparams.model.vocab_size, cfg.data.tokenizer_file)

    def check(self, tok: Tokenizer, source: str) -> Tokenizer:
        """``tok`` (from ``source``) is what this spec asks for, or a DataError saying how they differ."""
        if tok.kind != self.kind:
            raise DataError(f"{source} uses the {tok.kind} tokeniser but the run asks for hparams.tokenizer="
                            f"{self.kind}")
        if tok.vocab_size != self.vocab_size:
            raise DataError(f"{source} has {tok.vocab_size} token ids but hparams.model.vocab_size is "
                            f"{self.vocab_size}: they must be equal")
        return tok

    def describe(self) -> str:
        if self.kind == "bytes":
            return "bytes"
        return f"bpe-{self.vocab_size}" + (f" from {self.file}" if self.file else "")
