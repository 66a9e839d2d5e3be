"""Progress of long work: a bar on a terminal, plain lines (at most one per few seconds) otherwise."""
from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``advance(n)`` units of ``total``; ``close()`` prints the last line.  Use as a context manager."""

    def __init__(self, total: int, label: str, unit: str = "MB", scale: float = 1e6, stream: TextIO | None = None,
                 every_seconds: float = 5.0):
        self.total, self.label, self.unit, self.scale = max(1, total), label, unit, scale
        self.stream = stream or sys.stderr
        self.every, self.done, self.started = every_seconds, 0, time.monotonic()
        self._last = self.started
        self._bar = None
        if getattr(self.stream, "isatty", lambda: False)():
            from rich.console import Console
            from rich.progress import BarColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress
            self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(),
                                     TextColumn("{task.percentage:>3.0f}%"), TimeRemainingColumn(),
                                     console=Console(file=self.stream), transient=False)
            self._bar.start()
            self._task = self._bar.add_task(label, total=self.total)

    def advance(self, n: int) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(self._task, completed=min(self.done, self.total))
            return
        now = time.monotonic()
        if now - self._last >= self.every:
            self._last = now
            self._line()

    def _line(self, final: bool = False) -> None:
        pct = 100.0 * min(self.done, self.total) / self.total
        print(f"{self.label}: {pct:5.1f}% ({self.done / self.scale:.1f}/{self.total / self.scale:.1f} {self.unit}, "
              f"{time.monotonic() - self.started:.0f} s){' done' if final else ''}", file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        else:
            self._line(final=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
