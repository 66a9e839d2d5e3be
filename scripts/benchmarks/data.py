"""Data section: a miner's peak memory does not grow with the corpus (shards read sequence by sequence).

For each corpus size, text is generated deterministically (no download), turned into shards with
:func:`dso.data.shards.write_shards` (as ``scripts/prepare_data.py`` does), and a fresh process does a
miner's data work: open the shards (hashes checked), build the default model, and for several
windows draw its assignment, train a few AdamW steps on it and evaluate the validation batch.  Its
VmHWM (peak resident set) is ``rss_mb``.  The shard
writer's own peak is reported too (bounded by one shard's buffer).

``miner_peak_rss_mb``: list of ``{corpus_mb, rss_mb}``; ``rss_growth_mb`` is the difference between
the largest and the smallest corpus.  The byte tokeniser is used: shards are read the same way whatever
the tokeniser, and tokenising 200 MB with a BPE would only lengthen the benchmark.

Then :mod:`benchmarks.data_remote` measures a miner reading a 2 GiB corpus from a dataset bucket against
reading the same shards locally; its headline figures (``remote_vs_local``, ``cache_peak_mb``,
``cache_peak_share``, ``remote_rss_growth_mb``) are copied to the top of the section, the rest is under ``remote``.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np

from benchmarks import data_remote
from benchmarks.common import own_peak_rss_mb, worker_pool

WINDOWS, STEPS_PER_WINDOW = 4, 2
QUICK_WINDOWS, QUICK_STEPS = 2, 1  # quick mode (corpora of 2 and 8 MB): each part of the data work runs
HEADLINE = ("remote_vs_local", "cache_peak_mb", "cache_peak_share", "remote_rss_growth_mb")  # of data_remote
FILE_MB = 20  # generated corpora are split into files of about this size


def generate_corpus(folder: Path, megabytes: float, seed: int = 0) -> int:
    """Deterministic English-like text (Zipf-distributed pseudo-words, sentences, lines); returns bytes written."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    weights = 1.0 / np.arange(1, 27)
    words = np.array(["".join(rng.choice(letters, size=rng.integers(1, 10), p=weights / weights.sum()))
                      for _ in range(6000)])
    zipf = 1.0 / np.arange(1, words.size + 1)
    zipf /= zipf.sum()
    target, written, index = int(megabytes * 1e6), 0, 0
    folder.mkdir(parents=True, exist_ok=True)
    while written < target:
        size = min(FILE_MB * 10 ** 6, target - written)
        parts, length = [], 0
        while length < size:
            chunk = words[rng.choice(words.size, size=50_000, p=zipf)]
            line = " ".join(chunk.tolist()).replace(" e ", ". E ").replace(" t ", ",\n")
            parts.append(line + ".\n")
            length += len(parts[-1])
        text = "".join(parts)[:size].rsplit("\n", 1)[0] + "\n"
        (folder / f"part-{index:04d}.txt").write_text(text)
        written += len(text)
        index += 1
    return written


def prepare(source: Path, out: Path) -> dict:
    """Worker process: shards of ``source`` with the byte tokeniser; the writer's own peak RSS."""
    from benchmarks.common import setup_worker
    setup_worker()
    from dso.data.corpus import corpus_files
    from dso.data.shard_writer import write_shards
    from dso.data.tokenizer import Tokenizer
    manifest = write_shards(corpus_files(str(source)), Tokenizer.bytes(), out)
    return {"tokens": manifest.tokens, "shards": len(manifest.shards), "prepare_peak_rss_mb": own_peak_rss_mb()}


def miner_work(shards: str, cache_dir: str, windows: int = WINDOWS, steps: int = STEPS_PER_WINDOW) -> dict:
    """Worker process: what a miner does with its data for a few windows; its own peak RSS."""
    from benchmarks.common import setup_worker
    setup_worker()
    import torch

    from dso.config.schema import HParams
    from dso.data.dataset import Dataset
    from dso.data.tokenizer import TokenizerSpec
    from dso.nn.model import build_model
    from dso.training.train import evaluate

    hp = HParams(tokenizer="bytes")  # the shards are byte-level (see the module doc)
    hp.model.vocab_size = 256
    ds = Dataset.from_config(shards, cache_dir, hp.model.seq_len, hp.seed, hp.val_fraction,
                             tokenizer=TokenizerSpec("bytes", 256))
    model = build_model(hp.model, hp.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    val = ds.validation(hp.val_sequences)
    for window in range(windows):
        batch = ds.training_batch(0, window, hp.assigned_sequences, hp.batch_size * steps)
        for part in batch.split(hp.batch_size):
            opt.zero_grad(set_to_none=True)
            model.loss(part).backward()
            opt.step()
        ds.unassigned(np.random.default_rng(window), ds.assigned_rows(0, window, hp.assigned_sequences),
                      hp.eval_sequences)
        evaluate(model, val, hp.micro_batch)
    return {"rss_mb": own_peak_rss_mb(), "sequences": ds.n_sequences}


def rss_growth(rows: list[dict]) -> float:
    """Peak RSS of the largest corpus minus that of the smallest."""
    ordered = sorted(rows, key=lambda r: r["corpus_mb"])
    return ordered[-1]["rss_mb"] - ordered[0]["rss_mb"]


def run(quick: bool) -> dict:
    sizes = (2, 8) if quick else (20, 200)
    windows, steps = (QUICK_WINDOWS, QUICK_STEPS) if quick else (WINDOWS, STEPS_PER_WINDOW)
    rows, prepared = [], []
    root = Path(tempfile.mkdtemp(prefix="dso-bench-data-"))
    try:
        for mb in sizes:
            source, out = root / f"text-{mb}", root / f"shards-{mb}"
            written = generate_corpus(source, mb)
            with worker_pool(1) as pool:
                prep = pool.submit(prepare, source, out).result()
            shutil.rmtree(source)  # the text is not needed once it is in shards
            with worker_pool(1) as pool:
                miner = pool.submit(miner_work, str(out), str(root / "cache"), windows, steps).result()
            rows.append({"corpus_mb": round(written / 1e6, 1), "rss_mb": round(miner["rss_mb"], 1)})
            prepared.append({"corpus_mb": round(written / 1e6, 1), "tokens": prep["tokens"], "shards": prep["shards"],
                             "prepare_peak_rss_mb": round(prep["prepare_peak_rss_mb"], 1),
                             "sequences": miner["sequences"]})
            shutil.rmtree(out)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    remote = data_remote.run(quick)
    return {"miner_peak_rss_mb": rows, "rss_growth_mb": round(rss_growth(rows), 1), "prepare": prepared,
            "windows": windows, "steps_per_window": steps, "tokenizer": "bytes",
            **{k: remote[k] for k in HEADLINE}, "remote": remote}


def markdown(result: dict) -> str:
    lines = ["| corpus MB | miner peak RSS MB | prepare_data peak RSS MB | shards |", "|---:|---:|---:|---:|"]
    for row, prep in zip(result["miner_peak_rss_mb"], result["prepare"], strict=True):
        lines.append(f"| {row['corpus_mb']} | {row['rss_mb']} | {prep['prepare_peak_rss_mb']} | {prep['shards']} |")
    lines.append(f"\nminer peak RSS growth from the smallest to the largest corpus: {result['rss_growth_mb']} MB")
    if "remote" in result:
        lines += ["", data_remote.markdown(result["remote"])]
    return "\n".join(lines)
