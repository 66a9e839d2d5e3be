"""Data section, part two: a miner reading its corpus from a dataset bucket against reading local shards.

A corpus of random byte-level token ids (``2 × 2^30`` bytes of tokens, 32 shards of 2^25 ids; quick: 64 MiB)
is written as shards with chunk digests (:class:`dso.data.shard_writer.ShardWriter`), published to a dataset
bucket on an S3 server on loopback (SeaweedFS when its binary is there, else moto) with the code of
``prepare_data.py --upload``, and a fresh process does a miner's work for several windows: AdamW steps of 16
sequences of 129 ids on the default model shape (byte vocabulary) through its assignment, read as the miner
reads it (``Dataset.assignment``: each batch when it is trained on, the next two batches and as much of the
next window as this one trained on fetched in the background).

* ``remote_vs_local``: the miner's tokens/s reading from the bucket ÷ from the local shards (the same
  shards), windows after the first (the first fetches cold in both; ``first_window_s`` has it): the
  median over ``pairs`` runs of each, interleaved (local, remote, local, remote, …), of each remote run's
  tokens/s ÷ the local run just before it — a shared machine's load drifts more between runs than the
  data path costs (``remote_vs_local_means`` is the ratio of the means); ``cpu_s`` the CPU seconds of each run;
* ``cache_peak_mb``: the largest size of the miner's cache folder on disk, sampled every 0.5 s by a thread
  of the worker (not the cache's own accounting, which ``cache_accounted_peak_mb`` gives), against
  ``cache_mb`` (``--data.cache_mb`` of the run; smaller than what the windows fetch, so chunks are evicted);
  ``held_peak_mb``: the most read-ahead chunks held in memory for the reader (:mod:`dso.data.held_chunks`);
* ``remote_rss_mb`` / ``remote_rss_growth_mb``: the remote miner's peak RSS on a small corpus (2 shards)
  and on the large one;
* per window: MB fetched, chunks fetched (ranged GETs), seconds the miner waited for its data.

Random ids train nothing useful, but they cost the same to fetch, check and train on as text: this
measures throughput and memory.  The corpus is deleted afterwards (local shards, the server's data).
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.common import own_peak_rss_mb, setup_worker, worker_pool

FULL = {"shards": 32, "small_shards": 2, "shard_tokens": 1 << 25, "windows": 4, "steps": 32, "assigned": 512,
        "cache_mb": 96.0, "pairs": 3}
QUICK = {"shards": 2, "small_shards": 1, "shard_tokens": 1 << 24, "windows": 2, "steps": 2, "assigned": 64,
         "cache_mb": 8.0, "pairs": 1}
BATCH = 16
SAMPLE_SECONDS = 0.5  # a scan of ~1,500 cache files costs ~5 ms of CPU: every 50 ms took 10 % of a core


def write_random_shards(out: Path, shards: int, shard_tokens: int, seed: int = 0) -> None:
    """``shards`` shards of random byte ids (as uint16) with chunk digests and a manifest (bytes tokeniser)."""
    from dso.data.shard_writer import ShardWriter
    from dso.data.shards import CHUNK_BYTES, MANIFEST, Manifest
    from dso.data.tokenizer import Tokenizer
    from dso.util.atomic import atomic_write

    out.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    writer = ShardWriter(out, np.dtype(np.uint16), shard_tokens, CHUNK_BYTES)
    for _ in range(shards):
        writer.add(rng.integers(0, 256, size=shard_tokens, dtype=np.uint16))
    infos = writer.close()
    tok = Tokenizer.bytes()
    atomic_write(out / MANIFEST, Manifest("bytes", 256, tok.hash, "uint16", infos, chunk_bytes=CHUNK_BYTES)
                 .to_json().encode())


def _dir_bytes(folder: Path) -> int:
    total = 0
    for entry in os.scandir(folder):
        if not entry.name.startswith("."):
            try:
                total += entry.stat().st_size
            except FileNotFoundError:
                pass
    return total


def miner_work(corpus: str, endpoint: str, keys: tuple[str, str], cache_dir: str, cfg: dict) -> dict:
    """Worker process: a miner's windows on ``corpus`` (a shard folder or an s3:// URL)."""
    setup_worker()
    import torch

    from dso.config.schema import HParams
    from dso.data.dataset import Dataset
    from dso.data.shards import open_shards
    from dso.nn.model import build_model
    from neurons.miner import PREFETCH_STEPS

    hp = HParams(tokenizer="bytes")
    hp.model.vocab_size = 256
    if corpus.startswith("s3://"):
        from storage.client import S3Client
        from storage.dataset import open_remote
        client = S3Client(endpoint, "us-east-1", *keys, use_environment=False)
        shards = open_remote(corpus, client, cache_dir, cfg["cache_mb"])
    else:
        shards = open_shards(corpus, verify=False)  # (checked when written; the remote side checks per chunk)
    ds = Dataset.from_shards(shards, hp.model.seq_len, hp.seed, hp.val_fraction)
    remote = getattr(shards.arrays[0], "corpus", None)
    peak, stop = [0], threading.Event()
    if remote is not None:
        def sample() -> None:
            while not stop.wait(SAMPLE_SECONDS):
                peak[0] = max(peak[0], _dir_bytes(remote.cache.dir))
        threading.Thread(target=sample, daemon=True).start()
    model = build_model(hp.model, hp.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    windows = []
    for window in range(cfg["windows"]):
        fetched0 = (remote.fetched_bytes, remote.fetched_chunks) if remote else (0, 0)
        started, waited = time.perf_counter(), 0.0
        data = ds.assignment(0, window, cfg["assigned"], cfg["steps"] * BATCH, ahead=PREFETCH_STEPS * BATCH,
                             next_ahead=cfg["steps"] * BATCH)  # as a miner: what it trained this window
        for at in range(0, len(data), BATCH):
            asked = time.perf_counter()
            part = data[at:at + BATCH]
            waited += time.perf_counter() - asked
            opt.zero_grad(set_to_none=True)
            model.loss(part).backward()
            opt.step()
        windows.append({"seconds": time.perf_counter() - started, "data_wait_s": waited,
                        "tokens": len(data) * (data.width - 1),
                        "fetched_mb": ((remote.fetched_bytes - fetched0[0]) / 1e6) if remote else 0.0,
                        "chunks": (remote.fetched_chunks - fetched0[1]) if remote else 0})
    stop.set()
    steady = windows[1:]
    out = {"tokens_per_s": sum(w["tokens"] for w in steady) / sum(w["seconds"] for w in steady),
           "first_window_s": windows[0]["seconds"], "windows": windows, "rss_mb": own_peak_rss_mb(),
           "cpu_s": time.process_time(), "shards": len(shards.arrays)}
    if remote is not None:
        out.update(cache_peak_mb=max(peak[0], _dir_bytes(remote.cache.dir)) / 1e6,
                   cache_accounted_peak_mb=remote.cache.peak / 1e6, outages=remote.health.outages,
                   held_peak_mb=remote.held.peak / 1e6)
    return out


def _run(corpus: str, endpoint: str, keys: tuple[str, str], cache_dir: Path, cfg: dict) -> dict:
    shutil.rmtree(cache_dir, ignore_errors=True)
    with worker_pool(1) as pool:
        return pool.submit(miner_work, corpus, endpoint, keys, str(cache_dir), cfg).result()


def _engine():
    from storage.engines import engine_problem, start_engine
    return start_engine("seaweedfs" if engine_problem("seaweedfs") is None else "moto")


def run(quick: bool) -> dict:
    from storage.dataset_upload import publish

    cfg = QUICK if quick else FULL
    root = Path(tempfile.mkdtemp(prefix="dso-bench-remote-"))
    engine = None
    try:
        large, small = root / "large", root / "small"
        started = time.perf_counter()
        write_random_shards(large, cfg["shards"], cfg["shard_tokens"])
        write_random_shards(small, cfg["small_shards"], cfg["shard_tokens"], seed=1)
        written = time.perf_counter() - started
        engine = _engine()
        creds = engine.provision("bench-dataset")
        started = time.perf_counter()
        big = publish(large, f"s3://{creds.bucket}/large", creds.write_client())
        publish(small, f"s3://{creds.bucket}/small", creds.write_client())
        uploaded = time.perf_counter() - started
        keys = (creds.read_key_id, creds.read_secret)
        runs: dict[str, list[dict]] = {"local": [], "remote": []}
        for _ in range(cfg["pairs"]):  # interleaved: the machine's load drifts
            runs["local"].append(_run(str(large), "", ("", ""), root / "cache", cfg))
            runs["remote"].append(_run(big.url, engine.endpoint, keys, root / "cache", cfg))
        small_run = _run(f"s3://{creds.bucket}/small", engine.endpoint, keys, root / "cache", cfg)
    finally:
        if engine is not None:
            engine.stop()
        shutil.rmtree(root, ignore_errors=True)
    return summarise(runs, small_run, cfg, engine.name if engine else "", big.nbytes, written, uploaded)


def summarise(runs: dict[str, list[dict]], small_run: dict, cfg: dict, engine: str, nbytes: int,
              written_s: float, uploaded_s: float) -> dict:
    local = statistics.mean(r["tokens_per_s"] for r in runs["local"])
    remote = statistics.mean(r["tokens_per_s"] for r in runs["remote"])
    pairs = [after["tokens_per_s"] / before["tokens_per_s"]
             for before, after in zip(runs["local"], runs["remote"], strict=True)]
    remote_windows = [w for r in runs["remote"] for w in r["windows"][1:]]
    large_rss = max(r["rss_mb"] for r in runs["remote"])
    return {
        "remote_vs_local": round(statistics.median(pairs), 4),
        "remote_vs_local_means": round(remote / local, 4), "pair_ratios": [round(x, 4) for x in pairs],
        "cache_peak_mb": round(max(r["cache_peak_mb"] for r in runs["remote"]), 1),
        "cache_accounted_peak_mb": round(max(r["cache_accounted_peak_mb"] for r in runs["remote"]), 1),
        "cache_mb": cfg["cache_mb"],
        "held_peak_mb": round(max(r["held_peak_mb"] for r in runs["remote"]), 1),
        "cache_peak_share": round(max(r["cache_peak_mb"] for r in runs["remote"]) / cfg["cache_mb"], 3),
        "corpus_token_gb": round(nbytes / 2 ** 30, 2), "engine": engine,
        "tokens_per_s": {"local": [round(r["tokens_per_s"]) for r in runs["local"]],
                         "remote": [round(r["tokens_per_s"]) for r in runs["remote"]]},
        "first_window_s": {"local": [round(r["first_window_s"], 2) for r in runs["local"]],
                           "remote": [round(r["first_window_s"], 2) for r in runs["remote"]]},
        "per_window": {"fetched_mb": round(statistics.mean(w["fetched_mb"] for w in remote_windows), 1),
                       "chunks": round(statistics.mean(w["chunks"] for w in remote_windows), 1),
                       "data_wait_s": round(statistics.mean(w["data_wait_s"] for w in remote_windows), 3),
                       "local_data_wait_s": round(statistics.mean(
                           w["data_wait_s"] for r in runs["local"] for w in r["windows"][1:]), 3),
                       "seconds": round(statistics.mean(w["seconds"] for w in remote_windows), 2)},
        "cpu_s": {"local": [round(r["cpu_s"], 1) for r in runs["local"]],
                  "remote": [round(r["cpu_s"], 1) for r in runs["remote"]]},
        "remote_rss_mb": {"small": round(small_run["rss_mb"], 1), "large": round(large_rss, 1),
                          "small_shards": small_run["shards"], "large_shards": runs["remote"][0]["shards"]},
        "remote_rss_growth_mb": round(large_rss - small_run["rss_mb"], 1),
        "local_rss_mb": round(max(r["rss_mb"] for r in runs["local"]), 1),
        "outages": sum(r["outages"] for r in runs["remote"]),
        "settings": {**cfg, "batch": BATCH, "write_s": round(written_s, 1), "upload_s": round(uploaded_s, 1)},
    }


def markdown(result: dict) -> str:
    w = result["per_window"]
    rows = [("miner tokens/s, bucket ÷ local shards (`remote_vs_local`)", result["remote_vs_local"]),
            ("tokens/s local (each run)", result["tokens_per_s"]["local"]),
            ("tokens/s from the bucket (each run)", result["tokens_per_s"]["remote"]),
            ("cache on disk, peak MB (`cache_peak_mb`) / `--data.cache_mb`",
             f"{result['cache_peak_mb']} / {result['cache_mb']}"),
            ("per window: MB fetched, chunks (ranged GETs), seconds waited for data",
             f"{w['fetched_mb']}, {w['chunks']}, {w['data_wait_s']} (local {w['local_data_wait_s']})"),
            ("remote miner peak RSS MB, small → large corpus", f"{result['remote_rss_mb']['small']} → "
             f"{result['remote_rss_mb']['large']} ({result['remote_rss_mb']['small_shards']} → "
             f"{result['remote_rss_mb']['large_shards']} shards)"),
            ("corpus in the bucket (GiB of tokens), server", f"{result['corpus_token_gb']}, {result['engine']}")]
    return "\n".join(["| dataset bucket | value |", "|---|---:|"] + [f"| {k} | {v} |" for k, v in rows])
