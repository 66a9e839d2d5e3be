"""The local network's progress when its output is not a terminal: one plain, readable line per set-up step
and per window (sim/progress.py).  A real `make run`-style run into a file: tests/e2e/test_operations.py."""
from __future__ import annotations

import io

from rich.console import Console

from sim.progress import View, window_line

NAMES = {1: ("miner0", "honest"), 2: ("miner1", "honest"), 3: ("late0", "late"), 4: ("noise0", "noise"),
         5: ("diligent0", "diligent")}


def line(window: int, **changes) -> dict:
    record = {"window": window, "val_loss": 3.4657, "val_bits_per_byte": 5.0,
              "weights": {"1": 0.2, "2": 0.1, "3": 0.0, "4": 0.0, "5": 0.7},
              "rejections": {"3": "too_late"}}
    record.update(changes)
    return record


def test_a_window_is_one_readable_line():
    text = window_line(line(12), NAMES, done=3, windows=20, elapsed=84.4)
    assert "\n" not in text
    assert text == ("window 12  val loss 3.4657 nats/token (5.000 bits/byte)  weights: diligent0 0.70, miner0 0.20, "
                    "miner1 0.10  rejected: late0 too_late  [3/20, 84 s]")
    many = window_line(line(1, weights={str(u): 0.2 for u in NAMES}, rejections={}), NAMES, 1, 20, 5)
    assert "(+2 more > 0)" in many and "rejected: none" in many
    assert "val loss -" in window_line(line(1, val_loss=None), NAMES, 1, 20, 5)


def test_plain_view_prints_each_window_once_and_waits_visibly(monkeypatch):
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=60)   # narrow: lines must still not wrap
    assert not console.is_terminal
    view = View(console, NAMES, windows=3, started=0.0)
    view.step("data: hashing")
    monkeypatch.setattr("sim.progress.WAITING_EVERY", 0.0)
    view.update([], "waiting for the first window: 2/5 nodes up")
    view.update([line(7)])
    view.update([line(7), line(8)])
    view.update([line(7), line(8)])   # nothing new: nothing printed
    view.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("localnet: data: hashing  [")
    assert lines[1].startswith("localnet: waiting for the first window: 2/5 nodes up")
    assert [ln.split()[:2] for ln in lines[2:]] == [["window", "7"], ["window", "8"]]
    assert lines[3].endswith(" s]") and "[2/3, " in lines[3]


def test_terminal_view_spins_then_shows_the_live_table():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    view = View(console, NAMES, windows=3, started=0.0)
    view.step("S3 at http://127.0.0.1:1")
    view.update([line(7)])
    view.close()
    text = out.getvalue()
    assert "localnet: S3 at http://127.0.0.1:1" in text
    assert "window 7  (1/3 done)" in text and "diligent0" in text   # the table, with its title
    assert view._live is None and view._status is None
