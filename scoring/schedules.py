"""How a validator draws F_t and S_t and the data it evaluates on: the evaluation schedule as a strategy object.

* :data:`DRAWN` (what every node runs): peers and data drawn from the eval seed, the chain randomness of a
  block produced after the window's uploads closed (``selection.drawn_picker``, ``selection.public_rng``).
* :class:`LeastRecentSchedule`: the least recently picked first, data from the validator's secret.  With 30
  passing peers and 6 slots a peer is evaluated exactly every 5 windows, so a miner can train only in those.
  It is not a setting: experiments hand it to the simulator as the predictable baseline the drawn schedule is
  measured against (docs/decisions/0042-eval-schedule-out-of-the-config.md).
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from dso.config.schema import HParams
from scoring import selection
from scoring.state import ValidatorState

PURPOSE_FAST, PURPOSE_EVAL, PURPOSE_DATA = 1, 2, 3


class EvalSchedule(Protocol):
    predictable: bool  # whether S_t follows from the validator's state alone (the eval seed is not used)

    def picker(self, state: ValidatorState, hp: HParams, window: int, eval_seed: bytes,
               purpose: int) -> selection.Picker: ...

    def data_rng(self, state: ValidatorState, window: int, eval_seed: bytes) -> np.random.Generator: ...


class DrawnSchedule:
    """Drawn from the public eval seed: no miner knows at upload time whether it will be checked, and every
    validator scores on the same data, so their ratings agree."""

    predictable = False

    def picker(self, state: ValidatorState, hp: HParams, window: int, eval_seed: bytes,
               purpose: int) -> selection.Picker:
        return selection.drawn_picker(window, eval_seed, b"fast" if purpose == PURPOSE_FAST else b"eval",
                                      hp.eval_max_gap_factor)

    def data_rng(self, state: ValidatorState, window: int, eval_seed: bytes) -> np.random.Generator:
        return selection.public_rng(window, eval_seed, b"data")


class LeastRecentSchedule:
    """The old round robin: least recently picked first; the data from the validator's private secret."""

    predictable = True

    def picker(self, state: ValidatorState, hp: HParams, window: int, eval_seed: bytes,
               purpose: int) -> selection.Picker:
        return selection.least_recent_picker(state.rng(window, purpose))

    def data_rng(self, state: ValidatorState, window: int, eval_seed: bytes) -> np.random.Generator:
        return state.rng(window, PURPOSE_DATA)


DRAWN = DrawnSchedule()
