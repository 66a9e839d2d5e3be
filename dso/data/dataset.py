"""Training data as the protocol sees it: sequences, the validation split, and the per-peer assignment.

The token stream lives in pre-tokenised shards (:mod:`dso.data.shards`), read sequence by sequence with
positioned reads: a node's memory does not grow with the corpus.  Each shard is cut into non-overlapping
sequences of ``seq_len + 1``
ids (a shard's tail shorter than that is unused); sequences are numbered across shards in manifest
order ("rows").  Nothing of corpus size is held in memory:

* The validation split is a seeded hash of the row number: row ``r`` is held out when
  ``splitmix64(r ^ mix(seed)) < val_fraction · 2^64``.  Never assigned, never used for scoring.
* :meth:`Dataset.assigned` is ``SelectData(seed, uid, window)``: rows drawn by a generator seeded
  with (seed, uid, window), skipping validation rows and repeats — deterministic, so a validator
  rebuilds exactly the sequences a miner was given.  The assignment is larger than what a baseline
  miner trains on, so a miner that brings more compute trains on more of *its own* data.
* :meth:`Dataset.unassigned` draws training rows outside a given set with a generator the caller owns
  (a validator seeds it from a secret the miners never see), so a miner cannot predict ``D_rand``.

:meth:`Dataset.from_config` accepts a shard folder (or its ``manifest.json``), ``shakespeare``, a text
file or a folder of text / JSON-lines files; text corpora are tokenised once into shards in the cache.
A corpus in an object store (``s3://BUCKET/PREFIX``) is opened by ``storage.dataset`` and handed over as
a :class:`ShardSet` (:meth:`Dataset.from_shard_set`): its arrays fetch and check chunks on demand, so
:meth:`Dataset.rows` asks them for a batch's chunks all at once, and :meth:`Dataset.assignment` (what a
miner trains on) reads each batch as training reaches it while the next ones are fetched in the background.
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

from dso.config.schema import HParams
from dso.data.assignment import Assignment
from dso.data.corpus import SHAKESPEARE_HINT, DataError, corpus_files, find_shakespeare, fingerprint, total_bytes  # noqa: F401 (re-exported)
from dso.data.shard_writer import iter_all_text, prepared_shards
from dso.data.shards import (
    CHUNK_BYTES,
    MANIFEST,
    VERSION,
    ShardSet,
    TokenArray,
    is_shard_corpus,
    open_shards,
    read_manifest,
)
from dso.data.tokenizer import MIN_FREQUENCY, TRAIN_CAP_BYTES, Tokenizer, TokenizerSpec, train_bpe
from dso.util.progress import Progress

log = logging.getLogger(__name__)
_SCAN = 1 << 16  # rows hashed per step when counting or listing validation rows (bounds the temporaries)


def _rng(*words: int) -> np.random.Generator:
    return np.random.default_rng([w & 0xFFFFFFFF for w in words])


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        mixed: np.ndarray = z ^ (z >> np.uint64(31))
        return mixed


class _Rows:
    """``dataset.sequences[rows]``: token rows (int64) by row number, without materialising them all."""

    def __init__(self, ds: Dataset):
        self._ds = ds
        self.shape = (ds.n_sequences, ds.seq_len + 1)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: npt.ArrayLike) -> np.ndarray:
        if isinstance(rows, (int, np.integer)):
            row: np.ndarray = self._ds.rows(np.array([rows]))[0]
            return row
        return self._ds.rows(np.asarray(rows))


class Dataset:
    """Sequences of ``seq_len + 1`` ids over one or more token arrays (shard files or in-memory arrays)."""

    def __init__(self, tokens: np.ndarray | Sequence[np.ndarray | TokenArray], data_hash: str, seq_len: int, seed: int,
                 val_fraction: float = 0.02, tokenizer: Tokenizer | None = None):
        arrays = [tokens] if isinstance(tokens, np.ndarray) else list(tokens)
        self.data_hash, self.seq_len, self.seed, self.val_fraction = data_hash, seq_len, seed, val_fraction
        self.tokenizer = tokenizer or Tokenizer.bytes()
        width = seq_len + 1
        counts = [a.shape[0] // width for a in arrays]
        self._arrays = [a for a, c in zip(arrays, counts, strict=True) if c]
        self._starts = np.concatenate([[0], np.cumsum([c for c in counts if c])]).astype(np.int64)
        self.n_sequences = int(self._starts[-1])
        if self.n_sequences < 4:
            raise DataError(f"corpus holds {sum(a.shape[0] for a in arrays)} tokens: too few for sequences of "
                            f"{width}")
        self._salt = _splitmix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], np.uint64))[0]
        self._threshold = np.uint64(min(int(val_fraction * 2.0 ** 64), 2 ** 64 - 1))
        self._forced_val = -1
        self.n_val = self._count_validation()
        self.n_train = self.n_sequences - self.n_val
        if self.n_train < 1:
            raise DataError(f"val_fraction={val_fraction} leaves no training sequences")
        self._val_rows = np.empty(0, np.int64)
        self._val_scanned = 0
        self.sequences = _Rows(self)
        self.remote = any(hasattr(a, "prefetch") for a in self._arrays)  # arrays that fetch from far away

    # ------------------------------------------------------------ split
    def _hash(self, rows: np.ndarray) -> np.ndarray:
        return _splitmix64(rows.astype(np.uint64) ^ self._salt)

    def is_validation(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        held_out: np.ndarray = (self._hash(rows) < self._threshold) | (rows == self._forced_val)
        return held_out

    def _count_validation(self) -> int:
        n, best, best_row = 0, None, -1
        for start in range(0, self.n_sequences, _SCAN):
            rows = np.arange(start, min(start + _SCAN, self.n_sequences), dtype=np.int64)
            h = self._hash(rows)
            n += int((h < self._threshold).sum())
            i = int(h.argmin())
            if best is None or h[i] < best:
                best, best_row = h[i], int(rows[i])
        if n == 0:  # a tiny corpus: hold out the row of smallest hash, so there is a validation split
            self._forced_val = best_row
            n = 1
        return n

    # ------------------------------------------------------------ rows
    def rows(self, rows: np.ndarray) -> np.ndarray:
        """Token ids (int64, shape (len(rows), seq_len + 1)) of the given row numbers."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= self.n_sequences):
            raise IndexError(f"row out of range 0 … {self.n_sequences - 1}")
        width = self.seq_len + 1
        out = np.empty((rows.size, width), np.int64)
        shard = np.searchsorted(self._starts, rows, side="right") - 1
        if self.remote:
            self._fetch(rows, shard, urgent=True)  # every chunk of the batch at once, not one after another
        for i, (r, s) in enumerate(zip(rows.tolist(), shard.tolist(), strict=True)):
            off = (r - int(self._starts[s])) * width
            out[i] = self._arrays[s][off:off + width]
        return out

    def _fetch(self, rows: np.ndarray, shard: np.ndarray, urgent: bool) -> None:
        """Ask the arrays that fetch from far away for the token spans of ``rows`` (they return at once)."""
        width = self.seq_len + 1
        spans: dict[int, list[tuple[int, int]]] = {}
        for r, s in zip(rows.tolist(), shard.tolist(), strict=True):
            off = (r - int(self._starts[s])) * width
            spans.setdefault(s, []).append((off, off + width))
        for s, wanted in spans.items():
            prefetch = getattr(self._arrays[s], "prefetch", None)
            if prefetch is not None:
                prefetch(wanted, urgent)

    def prefetch(self, rows: np.ndarray) -> None:
        """Start fetching ``rows`` in the background (a no-op for local shards)."""
        if self.remote:
            rows = np.asarray(rows, dtype=np.int64).reshape(-1)
            rows = rows[(rows >= 0) & (rows < self.n_sequences)]
            self._fetch(rows, np.searchsorted(self._starts, rows, side="right") - 1, urgent=False)

    def _batch(self, rows: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(self.rows(rows))

    def target_bytes(self, batch: torch.Tensor) -> int:
        """Bytes of text the target tokens ``batch[:, 1:]`` stand for (the denominator of bits per byte)."""
        targets = batch[:, 1:].detach().to("cpu").numpy()
        return int(self.tokenizer.token_bytes[targets].sum())

    # ------------------------------------------------------------ draws
    def _train_rows_outside(self, exclude: set[int]) -> np.ndarray:
        """Every training row not in ``exclude`` (only called when that set is small)."""
        out = []
        for start in range(0, self.n_sequences, _SCAN):
            rows = np.arange(start, min(start + _SCAN, self.n_sequences), dtype=np.int64)
            out.append(rows[~self.is_validation(rows)])
        rows = np.concatenate(out)
        return rows[~np.isin(rows, np.fromiter(exclude, np.int64, len(exclude)))] if exclude else rows

    def _draw(self, rng: np.random.Generator, n: int, exclude: np.ndarray | None = None) -> np.ndarray:
        """``n`` distinct training rows outside ``exclude``, chosen by ``rng``, sorted."""
        excluded = set(np.asarray(exclude, dtype=np.int64).reshape(-1).tolist()) if exclude is not None else set()
        ex = np.fromiter(excluded, np.int64, len(excluded))
        ex = ex[(ex >= 0) & (ex < self.n_sequences)]
        available = self.n_train - int((~self.is_validation(ex)).sum())
        n = min(n, available)
        if n <= 0:
            return np.empty(0, np.int64)
        if available <= 2 * n:  # a small pool: list it and choose exactly
            pool = self._train_rows_outside(excluded)
            return np.sort(pool[rng.choice(pool.size, size=n, replace=False)])
        picked: list[int] = []
        seen = set(excluded)
        while len(picked) < n:
            cand = rng.integers(0, self.n_sequences, size=2 * (n - len(picked)) + 8)
            for r in cand[~self.is_validation(cand)].tolist():
                if r not in seen:
                    seen.add(r)
                    picked.append(r)
                    if len(picked) == n:
                        break
        return np.sort(np.array(picked, dtype=np.int64))

    def assigned_rows(self, uid: int, window: int, n: int) -> np.ndarray:
        """Row numbers of SelectData(seed, uid, window): the ``n`` sequences assigned to a peer for a window, in the
        order it trains on them — a shuffle of the draw, drawn from the same seed.

        A miner gets through a prefix of its assignment (as far as its compute goes), so the order decides what the
        network learns from: in row order every prefix came from the start of the corpus, and the sequences a miner
        trained on differed in kind from a random sample (the proof of computation compares the two)."""
        rng = _rng(self.seed, 0xA551, uid, window)
        drawn = self._draw(rng, n)
        return drawn[rng.permutation(drawn.size)]

    def assigned(self, uid: int, window: int, n: int) -> torch.Tensor:
        return self._batch(self.assigned_rows(uid, window, n))

    def training_batch(self, uid: int, window: int, assigned: int, n: int) -> torch.Tensor:
        """The first ``n`` of a peer's ``assigned`` sequences for a window, read now (a baseline miner trains on
        ``batch_size``, a diligent one on more)."""
        return self._batch(self.assigned_rows(uid, window, assigned)[:n])

    def assignment(self, uid: int, window: int, assigned: int, n: int, ahead: int,
                   next_ahead: int = 0) -> Assignment:
        """What a miner trains on: the first ``n`` of its ``assigned`` sequences, read as training reaches them
        (the clock may stop it long before ``n``).  From a remote corpus each batch read starts fetching the
        next ``ahead``, and the first ``max(ahead, next_ahead)`` of the same peer's next window start fetching now
        (a miner gives as ``next_ahead`` how many it got through last window)."""
        if self.remote:
            self.prefetch(self.assigned_rows(uid, window + 1, assigned)[:max(ahead, next_ahead)])
        return Assignment(self._batch, self.assigned_rows(uid, window, assigned)[:n], self.seq_len + 1, ahead,
                          self.prefetch if self.remote else None)

    def unassigned(self, rng: np.random.Generator, exclude: np.ndarray, n: int) -> torch.Tensor:
        """Training sequences outside ``exclude`` chosen by ``rng`` (the caller's secret randomness)."""
        return self._batch(self._draw(rng, n, exclude))

    def validation_rows(self, n: int) -> np.ndarray:
        """The first ``n`` held-out rows (fewer if the split is smaller): the same on every node."""
        while self._val_rows.size < n and self._val_scanned < self.n_sequences:
            start = self._val_scanned
            rows = np.arange(start, min(start + _SCAN, self.n_sequences), dtype=np.int64)
            self._val_rows = np.concatenate([self._val_rows, rows[self.is_validation(rows)]])
            self._val_scanned = int(rows[-1]) + 1
        return self._val_rows[:n]

    def validation(self, n: int) -> torch.Tensor:
        """A fixed slice of the held-out split (the same for every node and every window)."""
        return self._batch(self.validation_rows(n))

    # ------------------------------------------------------------ construction
    @classmethod
    def from_shards(cls, shards: ShardSet, seq_len: int, seed: int, val_fraction: float) -> Dataset:
        return cls(shards.arrays, shards.data_hash, seq_len, seed, val_fraction, shards.tokenizer)

    @classmethod
    def from_config(cls, corpus: str, cache_dir: str, seq_len: int, seed: int, val_fraction: float,
                    expected_hash: str = "", tokenizer: TokenizerSpec | None = None) -> Dataset:
        """The run's data: ``corpus`` tokenised as ``tokenizer`` asks (default: bytes), checked against
        ``expected_hash`` (the run's ``hparams.data_hash``; empty = not pinned)."""
        spec = tokenizer or TokenizerSpec()
        shards = load_corpus(corpus, cache_dir, spec)
        check_shards(shards, spec, expected_hash, corpus)
        return cls.from_shards(shards, seq_len, seed, val_fraction)

    @classmethod
    def from_shard_set(cls, hp: HParams, shards: ShardSet, tokenizer_file: str = "", corpus: str = "") -> Dataset:
        """The data of a run from opened shards (local, or a remote corpus): its tokeniser is the run's and its
        data hash the pinned one; ``corpus`` names it in messages (default: where the shards are)."""
        spec = TokenizerSpec(hp.tokenizer, hp.model.vocab_size, tokenizer_file)
        check_shards(shards, spec, hp.data_hash, corpus or shards.origin)
        return cls.from_shards(shards, hp.model.seq_len, hp.seed, hp.val_fraction)

    @classmethod
    def for_run(cls, hp: HParams, corpus: str, cache_dir: str, tokenizer_file: str = "") -> Dataset:
        """The data of a run with hyper-parameters ``hp``: its tokeniser, sequence length, seed and split,
        checked against its pinned ``hp.data_hash`` — what every node and experiment should call."""
        return cls.from_shard_set(hp, run_shards(hp, corpus, cache_dir, tokenizer_file), tokenizer_file, corpus)


def check_shards(shards: ShardSet, spec: TokenizerSpec, expected_hash: str, corpus: str) -> None:
    """The shards' tokeniser is the one ``spec`` names and their data hash the run's (when pinned)."""
    if spec.file:
        wanted = Tokenizer.from_file(spec.file)
        if wanted.hash != shards.tokenizer.hash:
            raise DataError(f"shard folder {shards.origin} was tokenised with {shards.tokenizer.describe()}, "
                            f"not with data.tokenizer_file {spec.file} ({wanted.describe()})")
    spec.check(shards.tokenizer, f"shard folder {shards.origin}")
    if expected_hash and shards.data_hash != expected_hash:
        raise DataError(mismatch_message(shards.data_hash, expected_hash, shards.tokenizer, corpus))


def mismatch_message(mine: str, run: str, tok: Tokenizer, corpus: str) -> str:
    head = f"data hash {mine[:16]}… differs from the run's {run[:16]}…: "
    if mine[:16] != run[:16]:
        return head + (f"this node's tokeniser ({tok.describe()}) is not the run's; every node must use the same "
                       "hparams.tokenizer, hparams.model.vocab_size and tokenizer file (data.tokenizer_file or "
                       "the shard folder's) — refusing to start")
    return head + f"this node would train on other text than its peers (corpus {corpus!r}); refusing to start"


# ------------------------------------------------------------------ corpus → shards
REMOTE_SCHEMES = ("s3://",)


def is_remote_corpus(corpus: str) -> bool:
    """``s3://BUCKET/PREFIX``: shards published with ``scripts/prepare_data.py --upload``."""
    return corpus.startswith(REMOTE_SCHEMES)


def corpus_tokenizer(corpus: str) -> TokenizerSpec | None:
    """The tokeniser a shard folder was made with (kind, vocabulary size), from its manifest alone;
    None for a text corpus.  Lets a launcher set ``hparams.tokenizer`` and ``hparams.model.vocab_size``
    from the shards the operator points it at."""
    if not is_shard_corpus(corpus):
        return None
    path = Path(corpus).expanduser()
    manifest = read_manifest(path.parent if path.name == MANIFEST else path)
    return TokenizerSpec(manifest.tokenizer_kind, manifest.vocab_size)


def run_shards(hp: HParams, corpus: str, cache_dir: str, tokenizer_file: str = "") -> ShardSet:
    """The shards of a local corpus tokenised as the run asks (not yet checked against the run: see
    :meth:`Dataset.from_shard_set`)."""
    return load_corpus(corpus, cache_dir, TokenizerSpec(hp.tokenizer, hp.model.vocab_size, tokenizer_file))


def load_corpus(corpus: str, cache_dir: str | Path, spec: TokenizerSpec) -> ShardSet:
    """Open a shard folder, or tokenise a text corpus into cached shards (training a BPE first if asked)."""
    if is_remote_corpus(corpus):
        raise DataError(f"corpus {corpus}: a corpus in an object store is opened by the nodes "
                        "(storage.dataset.open_dataset), not from a local path")
    if is_shard_corpus(corpus):
        return open_shards(corpus)
    files = corpus_files(corpus)
    cache_root = Path(cache_dir).expanduser()
    tok = resolve_tokenizer(spec, files, cache_root)
    # the format is in the key: folders of an older format (still used by older code) are left alone
    key = hashlib.sha256(f"shards|v{VERSION}|{CHUNK_BYTES}|{tok.hash}|{fingerprint(files)}".encode()).hexdigest()[:20]
    total = total_bytes(files)
    progress = Progress(total, f"tokenising {corpus} ({tok.describe()})") if total > 32 << 20 else None
    try:
        return prepared_shards(files, tok, cache_root, key, progress.advance if progress else None)
    finally:
        if progress:
            progress.close()


def resolve_tokenizer(spec: TokenizerSpec, files: list[Path], cache_root: Path) -> Tokenizer:
    """The tokeniser a spec names: bytes, the operator's file, or a BPE trained from ``files`` (cached)."""
    if spec.kind == "bytes":
        return spec.check(Tokenizer.bytes(), "the byte tokeniser")
    if spec.file:
        return spec.check(Tokenizer.from_file(spec.file), f"tokenizer file {spec.file}")
    key = hashlib.sha256(f"bpe|{spec.vocab_size}|{TRAIN_CAP_BYTES}|{MIN_FREQUENCY}|{fingerprint(files)}"
                         .encode()).hexdigest()[:20]
    path = cache_root / f"tokenizer-{key}.json"
    if path.is_file():
        try:
            return spec.check(Tokenizer.from_file(path), str(path))
        except DataError:
            pass  # a damaged cache is retrained below
    log.info("training a %d-token BPE on %d files (cached as %s)", spec.vocab_size, len(files), path)
    tok = train_bpe(iter_all_text(files), spec.vocab_size)
    try:
        tok.save(path)
    except OSError:
        pass  # caching is an optimisation only
    return tok

