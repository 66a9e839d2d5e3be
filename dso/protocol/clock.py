"""Windows and put windows, derived from chain time only (design §2).

``window(b) = b // blocks_per_window``.  The put window of window t opens at
the timestamp of the first block of window t+1 and lasts ``put_window_seconds``;
an object counts if its server LastModified is in ``[open - 1 s, close]``.

With commit-reveal (``hparams.commit_reveal``) the put window carries only the
commitments; the payloads follow in the *reveal window*, which starts when the
put window closes and is as long plus COMMIT_LOOK_DELAY: reveals wait until the
validators have looked at the commitments (docs/extensions.md §2).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from dso.chain.base import Chain, ChainError
from dso.chain.rules import FUTURE_BLOCK

TOLERANCE_SECONDS = 1.0  # S3 LastModified has one-second resolution
# Validators gather this long after the last upload of a window may land: an upload is provably late only
# once it lands more than TOLERANCE_SECONDS after the close.
GATHER_SETTLE_SECONDS = 1.5
EVAL_BLOCK_GRACE_SECONDS = 30.0  # how long past its scheduled time the eval-seed block is waited for
LOOK_MARGIN_SECONDS = 0.25  # clock skew between a validator and the peers' servers its looks allow for
COMMIT_LOOK_SECONDS = 0.75  # commit-reveal: the validators' look at the commitments, before any reveal
COMMIT_LOOK_DELAY = LOOK_MARGIN_SECONDS + COMMIT_LOOK_SECONDS  # how much later reveals start for that look


@dataclass(frozen=True)
class PutWindow:
    window: int
    open: float   # unix seconds
    close: float

    def classify(self, last_modified: float) -> str:
        """'early', 'ok' or 'late' for an object's server LastModified (unix seconds)."""
        if last_modified < self.open - TOLERANCE_SECONDS:
            return "early"
        if last_modified > self.close:
            return "late"
        return "ok"


class Clock:
    def __init__(self, chain: Chain, blocks_per_window: int, put_window_seconds: float):
        self.chain = chain
        self.blocks_per_window = blocks_per_window
        self.put_window_seconds = put_window_seconds

    def window_of(self, block: int) -> int:
        return block // self.blocks_per_window

    def current_window(self) -> int:
        return self.window_of(self.chain.block())

    def first_block(self, window: int) -> int:
        return window * self.blocks_per_window

    def window_start(self, window: int) -> float:
        return self.chain.block_timestamp(self.first_block(window))

    def window_seconds(self) -> float:
        """How long the latest complete window lasted (chain time)."""
        w = max(1, self.current_window())
        return self.window_start(w) - self.window_start(w - 1)

    def put_window(self, window: int) -> PutWindow:
        opens = self.window_start(window + 1)
        return PutWindow(window, opens, opens + self.put_window_seconds)

    def reveal_window(self, window: int) -> PutWindow:
        """Commit-reveal: payloads of window t land in [put close, put close + put_window_seconds]."""
        return reveal_window_after(self.put_window(window))

    def uploads_close(self, window: int, commit_reveal: bool) -> float:
        """When the last upload of window t may land: gathering starts after this (+ a settle time)."""
        return (self.reveal_window(window) if commit_reveal else self.put_window(window)).close

    def window_randomness(self, window: int) -> bytes:
        """Randomness fixed when window t's put window opens: unknown while peers train on window t."""
        return self.chain.randomness(self.first_block(window + 1))

    def eval_block(self, window: int, commit_reveal: bool) -> int:
        """The first block produced once no upload of window t can count any more: its timestamp is at least
        ⌊uploads close⌋ + 1 s (LastModified is truncated to whole seconds, so an object written up to then can
        still carry a timely time).  Its randomness draws the window's F_t and S_t."""
        after = math.floor(self.uploads_close(window, commit_reveal)) + TOLERANCE_SECONDS
        block = self.first_block(window + 1)
        while self.chain.block_timestamp(block) < after:
            block += 1
        return block

    def eval_randomness(self, window: int, commit_reveal: bool, stop: Callable[[], bool] | None = None) -> bytes:
        """Randomness no miner knew while it could still upload for window t (waits for the block if needed)."""
        block = self.eval_block(window, commit_reveal)
        due = self.chain.block_timestamp(block)
        self.sleep_until(due, stop)
        while True:
            try:
                return self.chain.randomness(block)
            except ChainError as e:  # block time is a schedule: the block may land a little late
                if e.reason != FUTURE_BLOCK or time.time() > due + EVAL_BLOCK_GRACE_SECONDS or (stop and stop()):
                    raise
                time.sleep(0.2)

    def sleep_until(self, timestamp: float, stop: Callable[[], bool] | None = None, step: float = 0.2) -> bool:
        """Sleep until chain time ``timestamp``; returns False early if ``stop()`` becomes true."""
        while True:
            remaining = timestamp - time.time()
            if remaining <= 0:
                return True
            if stop is not None and stop():
                return False
            time.sleep(min(step, remaining))


def certain_after(close: float, margin: float = LOOK_MARGIN_SECONDS) -> float:
    """The earliest moment an absence proves lateness: an object written from then on has a whole-second
    LastModified > ``close`` on an honest server, and ``margin`` covers clock skew (storage/look.py)."""
    return math.floor(close) + TOLERANCE_SECONDS + margin


def reveal_window_after(put: PutWindow) -> PutWindow:
    """The reveal window that follows a put window: opening at its close, as long plus COMMIT_LOOK_DELAY (the
    reveals start that much later, once the validators have looked at the commitments)."""
    return PutWindow(put.window, put.close, put.close + (put.close - put.open) + COMMIT_LOOK_DELAY)


def commit_look_ends(put: PutWindow) -> float:
    """When the validators' look at the commitments must be over: the reveals begin then."""
    return certain_after(put.close) + COMMIT_LOOK_SECONDS


def reveal_time(put: PutWindow, margin: float = 0.05) -> float:
    """Earliest moment a miner may reveal: once the validators' look at the commitments is over.

    S3 LastModified has whole-second resolution (truncated), so a commitment uploaded at time x counts
    as in time while floor(x) <= close, and a peer serving its own bucket can forge it anyway.  So the
    validators look at every commitment from :func:`certain_after` the close (a commitment absent then was
    written late) until :func:`commit_look_ends`; a commitment seen by then was made before anyone revealed,
    blind.  Revealing any earlier would let a copier commit to a copy of a reveal before the look."""
    return commit_look_ends(put) + margin
