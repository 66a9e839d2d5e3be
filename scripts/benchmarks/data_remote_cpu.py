"""What reading a miner's assignment from a dataset bucket costs in CPU, whatever the machine's load.

The miner of :mod:`benchmarks.data_remote` with its training replaced by a sleep of ``--step-s`` per step:
every CPU second the process spends is then the data path's (requests, checks, the cache, the read-ahead
threads), and CPU time does not grow when other processes compete for the cores, as wall time does.
Per window after the first: process CPU seconds, the CPU of the other threads (the fetch threads, from
``/proc/self/task``), MB and chunks fetched, ranged GETs, seconds the reader waited; CPU ms per MB fetched.
``--profile`` adds the top functions of a cProfile of every thread (cumulative, fetch threads and reader).

    PYTHONPATH=. OMP_NUM_THREADS=1 python scripts/benchmarks/data_remote_cpu.py --shards 8 --windows 4
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])]

from benchmarks.common import setup_worker, worker_pool  # noqa: E402
from benchmarks.data_remote import BATCH, _engine, write_random_shards  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def other_threads_cpu_s() -> float:
    """CPU seconds of this process's threads other than the calling one (Linux /proc): the fetch threads."""
    total, me = 0.0, threading.get_native_id()
    for tid in os.listdir("/proc/self/task"):
        try:
            if int(tid) != me:
                fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / TICK
        except (OSError, IndexError, ValueError):
            continue
    return total


def _profiled(profiles: list[cProfile.Profile], work):  # type: ignore[no-untyped-def]
    def run(self):  # type: ignore[no-untyped-def]
        prof = cProfile.Profile(time.thread_time)
        profiles.append(prof)
        prof.enable()
        work(self)
    return run


def miner_reads(url: str, endpoint: str, keys: tuple[str, str], cache_dir: str, cfg: dict) -> dict:
    """Worker process: a miner's windows of reads from ``url``, its training replaced by a sleep."""
    setup_worker()
    from dso.config.schema import HParams
    from dso.data.dataset import Dataset
    from dso.data.remote_shards import RemoteCorpus
    from neurons.miner import PREFETCH_STEPS
    from storage.client import S3Client
    from storage.dataset import open_remote

    profiles: list[cProfile.Profile] = []
    if cfg["profile"]:
        RemoteCorpus._work = _profiled(profiles, RemoteCorpus._work)  # type: ignore[method-assign]
        reader = cProfile.Profile(time.thread_time)
        profiles.append(reader)
    hp = HParams(tokenizer="bytes")
    client = S3Client(endpoint, "us-east-1", *keys, use_environment=False)
    shards = open_remote(url, client, cache_dir, cfg["cache_mb"])
    ds = Dataset.from_shards(shards, hp.model.seq_len, hp.seed, hp.val_fraction)
    remote = shards.arrays[0].corpus  # type: ignore[attr-defined]
    windows = []
    for window in range(cfg["windows"]):
        before = (time.process_time(), other_threads_cpu_s(), remote.fetched_bytes, remote.fetched_chunks,
                  getattr(getattr(remote.source, "ranges", None), "requests", 0))
        started, waited = time.perf_counter(), 0.0
        data = ds.assignment(0, window, cfg["assigned"], cfg["steps"] * BATCH, ahead=PREFETCH_STEPS * BATCH,
                             next_ahead=cfg["steps"] * BATCH)
        for at in range(0, len(data), BATCH):
            asked = time.perf_counter()
            if cfg["profile"]:
                reader.enable()
            data[at:at + BATCH]
            if cfg["profile"]:
                reader.disable()
            waited += time.perf_counter() - asked
            time.sleep(cfg["step_s"])  # the training step
        mb = (remote.fetched_bytes - before[2]) / 1e6
        windows.append({"cpu_s": time.process_time() - before[0],
                        "fetch_threads_cpu_s": other_threads_cpu_s() - before[1],
                        "seconds": time.perf_counter() - started, "data_wait_s": waited, "fetched_mb": mb,
                        "chunks": remote.fetched_chunks - before[3],
                        "requests": getattr(getattr(remote.source, "ranges", None), "requests", 0) - before[4]})
    steady = windows[1:]
    cpu = sum(w["cpu_s"] for w in steady)
    out = {"cpu_s_per_window": statistics.mean(w["cpu_s"] for w in steady),
           "fetch_threads_cpu_s_per_window": statistics.mean(w["fetch_threads_cpu_s"] for w in steady),
           "cpu_ms_per_mb": 1000 * cpu / max(1e-9, sum(w["fetched_mb"] for w in steady)),
           "data_wait_s_per_window": statistics.mean(w["data_wait_s"] for w in steady),
           "first_window": windows[0], "windows": steady, "cache_peak_mb": remote.cache.peak / 1e6}
    if profiles:
        stream = io.StringIO()
        stats = pstats.Stats(profiles[0], stream=stream)
        for prof in profiles[1:]:
            stats.add(prof)
        stats.sort_stats("cumulative").print_stats(45)
        out["profile"] = stream.getvalue()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--shard-tokens", type=int, default=1 << 25)
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--assigned", type=int, default=512)
    parser.add_argument("--step-s", type=float, default=0.1, help="seconds each training step sleeps")
    parser.add_argument("--cache-mb", type=float, default=96.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", default="", help="JSON report path")
    args = parser.parse_args()
    from storage.dataset_upload import publish

    cfg = {"windows": args.windows, "steps": args.steps, "assigned": args.assigned, "step_s": args.step_s,
           "cache_mb": args.cache_mb, "profile": args.profile}
    root = Path(tempfile.mkdtemp(prefix="dso-bench-remote-cpu-"))
    engine = None
    try:
        write_random_shards(root / "shards", args.shards, args.shard_tokens)
        engine = _engine()
        creds = engine.provision("bench-dataset")
        big = publish(root / "shards", f"s3://{creds.bucket}/large", creds.write_client())
        shutil.rmtree(root / "shards")
        runs = []
        for i in range(args.runs):
            shutil.rmtree(root / "cache", ignore_errors=True)
            with worker_pool(1) as pool:
                runs.append(pool.submit(miner_reads, big.url, engine.endpoint,
                                        (creds.read_key_id, creds.read_secret), str(root / "cache"), cfg).result())
            r = runs[-1]
            print(f"run {i}: {r['cpu_s_per_window']:.3f} CPU s/window (fetch threads "
                  f"{r['fetch_threads_cpu_s_per_window']:.3f}), {r['cpu_ms_per_mb']:.1f} CPU ms/MB, "
                  f"wait {r['data_wait_s_per_window']:.3f} s/window, "
                  f"{statistics.mean(w['fetched_mb'] for w in r['windows']):.1f} MB and "
                  f"{statistics.mean(w['chunks'] for w in r['windows']):.0f} chunks in "
                  f"{statistics.mean(w['requests'] for w in r['windows']):.0f} GETs/window", flush=True)
            if "profile" in r:
                print(r["profile"])
    finally:
        if engine is not None:
            engine.stop()
        shutil.rmtree(root, ignore_errors=True)
    report = {"engine": engine.name if engine else "", "settings": {**cfg, "shards": args.shards,
              "shard_tokens": args.shard_tokens}, "runs": runs,
              "cpu_s_per_window": statistics.median(r["cpu_s_per_window"] for r in runs),
              "cpu_ms_per_mb": statistics.median(r["cpu_ms_per_mb"] for r in runs),
              "data_wait_s_per_window": statistics.median(r["data_wait_s_per_window"] for r in runs)}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
