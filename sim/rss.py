"""Where a process's resident memory peaks: the highest VmRSS seen in each named phase of its work.

A thread samples ``/proc/self/status`` every few milliseconds and every phase change samples once more, so a
phase's figure is at least what was resident when it ended; a peak shorter than the sampling interval inside
a phase can be missed (VmHWM, :func:`sim.scale.peak_rss_mb`, gives the process's true peak).
"""
from __future__ import annotations

import threading
from types import TracebackType


def rss_mb() -> float:
    """This process's resident set now (VmRSS), in MB (NaN where /proc is missing)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


class PhasePeaks:
    """``with PhasePeaks() as peaks: …; peaks.phase("train"); …`` → ``peaks.peaks_mb``: phase → highest RSS."""

    def __init__(self, first: str = "start", interval_s: float = 0.005):
        self.current, self.interval_s = first, interval_s
        self.peaks_mb: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, daemon=True)

    def _record(self) -> None:
        now = rss_mb()
        with self._lock:
            self.peaks_mb[self.current] = max(self.peaks_mb.get(self.current, 0.0), now)

    def _sample_until_stopped(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._record()

    def phase(self, name: str) -> None:
        """The phase so far ends (sampled once more), ``name`` begins."""
        self._record()
        with self._lock:
            self.current = name

    def __enter__(self) -> PhasePeaks:
        self._record()
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self._record()
