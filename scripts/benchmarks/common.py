"""Helpers shared by benchmark sections: timing, memory, worker processes, the default data set."""
from __future__ import annotations

import math
import os
import resource
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def median_times(fn: Callable[[], object], repeats: int, warmup: int = 1) -> tuple[float, float]:
    """(median wall ms, median CPU ms of this process) over ``repeats`` calls.

    With one torch thread, CPU time is what the work itself costs: unlike wall time it does not
    grow when other processes compete for the cores."""
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        cpu.append((time.process_time() - c0) * 1000)
        wall.append((time.perf_counter() - w0) * 1000)
    return statistics.median(wall), statistics.median(cpu)


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    return median_times(fn, repeats, warmup)[0]


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """A fresh process per worker, forked from an interpreter that has only imported torch (sim.ranks): a peak-RSS
    reading that does not include the benchmark's own memory, and no state of the parent."""
    from sim.ranks import preloaded_context
    return ProcessPoolExecutor(max_workers=workers, mp_context=preloaded_context())


def own_peak_rss_mb() -> float:
    """Peak resident set of this process so far.

    VmHWM first: ``ru_maxrss`` survives ``exec`` on Linux, so a spawned worker would report the peak
    of the parent it was forked from (the benchmark itself) instead of its own."""
    return proc_peak_rss_mb(os.getpid()) or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def proc_peak_rss_mb(pid: int) -> float | None:
    """VmHWM (peak resident set) of a running process from /proc; None when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def proc_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a process has used so far (all its threads), from /proc/<pid>/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    except (OSError, ValueError, IndexError):
        return None


def finite_or_none(x: float) -> float | None:
    """JSON has no NaN/inf: a diverged or undefined loss is written as null."""
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def default_dataset(hp):
    """The data set every node of a default run trains on (Shakespeare, cached shards, the run's tokeniser)."""
    from dso.data.dataset import Dataset
    return Dataset.for_run(hp, "shakespeare", "~/.cache/dso")


def preset_hparams(preset: str):
    """Default hyper-parameters with a named model preset (dso.nn.presets) applied."""
    from dso.config.schema import HParams
    hp = HParams()
    hp.model.preset = preset
    hp.model.apply_preset()
    hp.validate("hparams")
    return hp


def setup_worker() -> None:
    """Worker processes (like the nodes of a network on one machine) use one torch thread."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    torch.set_num_threads(1)


def save_plot(fig: Any, ax: Any, path: Path, xlabel: str, ylabel: str, title: str) -> None:
    """Label, grid and legend a one-axes benchmark figure, then write it to ``path`` and close it."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
