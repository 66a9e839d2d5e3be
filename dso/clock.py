"""Windows and put windows, derived from chain time only (DESIGN §2).

``window(b) = b // blocks_per_window``.  The put window of window t opens at
the timestamp of the first block of window t+1 and lasts ``put_window_seconds``;
an object counts if its server LastModified is in ``[open - 1 s, close]``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from dso.chain.base import Chain

TOLERANCE_SECONDS = 1.0  # S3 LastModified has one-second resolution


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

    def put_window(self, window: int) -> PutWindow:
        opens = self.window_start(window + 1)
        return PutWindow(window, opens, opens + self.put_window_seconds)

    def window_randomness(self, window: int) -> bytes:
        """Randomness fixed when window t's put window opens: unknown while peers train on window t."""
        return self.chain.randomness(self.first_block(window + 1))

    def sleep_until(self, timestamp: float, stop=None, step: float = 0.2) -> bool:
        """Sleep until chain time ``timestamp``; returns False early if ``stop()`` becomes true."""
        while True:
            remaining = timestamp - time.time()
            if remaining <= 0:
                return True
            if stop is not None and stop():
                return False
            time.sleep(min(step, remaining))
