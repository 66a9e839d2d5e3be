"""How the local network shows its progress: a live table on a terminal, plain lines anywhere else.

Output that is not a terminal (a file, a pipe to ``tee``, CI, ``nohup``, systemd) gets one plain line per
set-up step and one per finished window — window, validation loss (nats per token and bits per byte),
a weights summary, the window's rejections and the elapsed time — so ``make run > out.txt`` reads as a
log.  On a terminal the same set-up steps show under a spinner, then the live table.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.status import Status
from rich.table import Table

Names = dict[int, tuple[str, str]]  # uid → (name, behaviour)
Line = Mapping[str, Any]  # one validator JSON line, as parsed: read with .get, nothing assumed present
WAITING_EVERY = 15.0  # seconds between "still waiting for the first window" lines


def loss_text(nats: Any, bits: Any = None) -> str:
    if not isinstance(nats, (int, float)) or nats != nats:
        return "val loss -"
    per_byte = f" ({bits:.3f} bits/byte)" if isinstance(bits, (int, float)) and bits == bits else ""
    return f"val loss {nats:.4f} nats/token{per_byte}"


def weights_text(weights: dict[str, float], names: Names, top: int = 3) -> str:
    positive = sorted(((w, u) for u, w in weights.items() if w > 0), reverse=True)
    if not positive:
        return "weights: none > 0"
    shown = ", ".join(f"{names.get(int(u), (u,))[0]} {w:.2f}" for w, u in positive[:top])
    more = f" (+{len(positive) - top} more > 0)" if len(positive) > top else ""
    return f"weights: {shown}{more}"


def rejections_text(rejections: dict[str, str], names: Names) -> str:
    if not rejections:
        return "rejected: none"
    return "rejected: " + ", ".join(f"{names.get(int(u), (u,))[0]} {r}" for u, r in sorted(
        rejections.items(), key=lambda kv: int(kv[0])))


def window_line(line: Line, names: Names, done: int, windows: int, elapsed: float) -> str:
    """One finished window as one plain line."""
    return (f"window {line.get('window', '?')}  {loss_text(line.get('val_loss'), line.get('val_bits_per_byte'))}  "
            f"{weights_text(line.get('weights', {}), names)}  {rejections_text(line.get('rejections', {}), names)}  "
            f"[{done}/{windows}, {elapsed:.0f} s]")


def live_table(lines: Sequence[Line], names: Names, windows: int, elapsed: float, waiting: str = "") -> Table:
    last = lines[-1] if lines else {}
    loss = loss_text(last.get("val_loss"), last.get("val_bits_per_byte"))
    title = (f"window {last.get('window', '-')}  ({len(lines)}/{windows} done)   {loss}"
             f"   {elapsed:.0f}s" + (f"   {waiting}" if waiting else ""))
    table = Table(title=title, title_justify="left")
    for col in ("uid", "miner", "behaviour", "score", "LossRating", "μ", "weight", "rejections"):
        table.add_column(col, justify="right" if col not in ("miner", "behaviour", "rejections") else "left")
    counts: dict[str, dict[str, int]] = {}
    for line in lines:
        for uid, reason in line.get("rejections", {}).items():
            counts.setdefault(uid, {}).setdefault(reason, 0)
            counts[uid][reason] += 1
    for uid, (name, behaviour) in sorted(names.items()):
        key = str(uid)
        table.add_row(key, name, behaviour, _cell(last.get("scores", {}), key),
                      _cell(last.get("loss_ratings", {}), key, "{:.1f}"), _cell(last.get("mu", {}), key, "{:.2f}"),
                      _cell(last.get("weights", {}), key, "{:.3f}"),
                      ", ".join(f"{r}×{n}" for r, n in counts.get(key, {}).items()))
    return table


def _cell(values: Mapping[str, float], key: str, fmt: str = "{:.3f}") -> str:
    return fmt.format(values[key]) if key in values else "-"


class View:
    """Set-up steps, then windows: :meth:`step` for each set-up line, :meth:`update` with every validator
    line so far (called about once a second), :meth:`close` at the end."""

    def __init__(self, console: Console, names: Names, windows: int, started: float):
        self.console, self.names, self.windows, self.started = console, names, windows, started
        self.terminal = console.is_terminal
        self._status: Status | None = None
        self._live: Live | None = None
        self._shown = 0
        self._last_wait = time.time()

    def elapsed(self) -> float:
        return time.time() - self.started

    def say(self, text: str) -> None:
        self.console.print(f"localnet: {text}", highlight=False, soft_wrap=True)

    def step(self, text: str) -> None:
        if self.terminal:  # the step shows under a spinner; finished steps stay above it
            if self._status is None:
                self._status = self.console.status(text)
                self._status.start()
            else:
                self._status.update(text)
        self.say(f"{text}  [{self.elapsed():.0f} s]")

    def update(self, lines: Sequence[Line], waiting: str = "") -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
        if self.terminal:
            table = live_table(lines, self.names, self.windows, self.elapsed(), "" if lines else waiting)
            if self._live is None:
                self._live = Live(table, console=self.console, refresh_per_second=1)
                self._live.start()
            else:
                self._live.update(table)
            return
        for done, line in enumerate(lines[self._shown:], self._shown + 1):
            self.console.print(window_line(line, self.names, done, self.windows, self.elapsed()), highlight=False,
                               soft_wrap=True)
        self._shown = len(lines)
        if not lines and waiting and time.time() - self._last_wait >= WAITING_EVERY:
            self._last_wait = time.time()
            self.say(f"{waiting}  [{self.elapsed():.0f} s]")

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
        if self._live is not None:
            self._live.stop()
            self._live = None
