"""Peak memory of real miner and validator processes: a small local network for a few windows.

Uses :class:`sim.localnet.LocalNet` (embedded S3, LocalChain, one process per node) and reads
each process's VmHWM from /proc while it is still running (VmHWM is the peak so far, so the last
reading before the stop is the peak of the run).
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import proc_peak_rss_mb


def localnet_peaks(miners: int = 3, windows: int = 3, timeout: float | None = None) -> dict:
    """{validator_peak_rss_mb, miner_peak_rss_mb, ...}; {"error": ...} if the network does not get going."""
    from dso.config.schema import HParams
    from sim.localnet import LocalNet, plan_nodes

    hp = HParams()
    timeout = timeout or 60 + 2 * windows * hp.blocks_per_window
    peaks: dict[str, float] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dso-bench-net-") as run_dir:
        net = LocalNet(Path(run_dir), hp, plan_nodes(miners, [], 1))
        with net:
            net.prepare()
            net.start()
            deadline = time.time() + timeout
            while time.time() < deadline and len(net.validator_lines()) < windows and not net.dead():
                _read_peaks(net, peaks)
                time.sleep(0.5)
            _read_peaks(net, peaks)
            lines = net.validator_lines()
            dead = [n.name for n in net.dead()]
    out = {"miners": miners, "windows_scored": len(lines), "seconds": time.perf_counter() - started,
           "peak_rss_mb_by_process": peaks}
    if len(lines) < windows:
        out["error"] = (f"local network scored {len(lines)} of {windows} windows in {timeout:.0f} s"
                        + (f"; exited: {', '.join(dead)}" if dead else ""))
    miner_peaks = [v for k, v in peaks.items() if k.startswith("miner")]
    if "validator0" in peaks:
        out["validator_peak_rss_mb"] = peaks["validator0"]
    if miner_peaks:
        out["miner_peak_rss_mb"] = max(miner_peaks)
    window_seconds = [line["seconds"] for line in lines if isinstance(line.get("seconds"), (int, float))]
    if window_seconds:
        out["validator_window_seconds_median"] = statistics.median(window_seconds)
    return out


def _read_peaks(net, peaks: dict[str, float]) -> None:
    for node in net.nodes:
        if node.process is not None and node.process.poll() is None:
            value = proc_peak_rss_mb(node.process.pid)
            if value is not None:
                peaks[node.name] = max(value, peaks.get(node.name, 0.0))
