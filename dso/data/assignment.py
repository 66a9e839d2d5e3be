"""A window's sequences in training order, read as training reaches them
(:meth:`dso.data.dataset.Dataset.assignment`)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch


class Assignment:
    """A window's sequences in training order, read when a slice of them is asked for: a miner trains on as
    many as the clock allows, and reading all of them first (from a remote corpus) can cost the window.

    ``read`` gives the tokens of row numbers; ``prefetch`` (a remote corpus) starts fetching rows in the
    background, asked for the ``ahead`` rows after every slice read."""

    def __init__(self, read: Callable[[np.ndarray], torch.Tensor], rows: np.ndarray, width: int, ahead: int = 0,
                 prefetch: Callable[[np.ndarray], None] | None = None):
        self.read, self.rows, self.width, self.ahead, self.prefetch = read, rows, width, ahead, prefetch

    @classmethod
    def of(cls, tokens: torch.Tensor) -> Assignment:
        """Sequences already in memory."""
        return cls(lambda rows: tokens[torch.from_numpy(rows)], np.arange(tokens.shape[0], dtype=np.int64),
                   int(tokens.shape[1]))

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.rows.size), self.width

    def __len__(self) -> int:
        return int(self.rows.size)

    def __getitem__(self, key: slice) -> torch.Tensor:
        """The tokens of a slice of the sequences (read now)."""
        start, stop, _ = key.indices(self.rows.size)
        if self.prefetch is not None and self.ahead:
            self.prefetch(self.rows[max(start, stop):max(start, stop) + self.ahead])
        return self.read(self.rows[key])

    def skip(self, n: int) -> Assignment:
        """The sequences after the first ``n``."""
        return Assignment(self.read, self.rows[n:], self.width, self.ahead, self.prefetch)

