"""Behaviours that upload an update again: the public aggregate (now or some windows ago), their own first update,
or their last trained one between the windows they train (part-time)."""
from __future__ import annotations

from collections import deque
from typing import ClassVar

import torch

from dso.codec.codecs import Update
from sim.behaviours.base import REPLAY_LAG, Behaviour, Foresight, Inputs, Plan
from sim.behaviours.no_work import Freerider
from sim.behaviours.updates import replay, zeros


class Replayer(Freerider):
    """Uploads the public aggregate of ``lag`` windows ago as its own update."""

    name, needs_previous = "replayer", True
    lag: ClassVar[int] = 1

    def __init__(self) -> None:
        self.aggregates: deque[dict[str, torch.Tensor] | None] = deque(maxlen=self.lag)

    def upload(self, inputs: Inputs) -> Update | None:
        self.aggregates.append(inputs.previous)
        old = self.aggregates[0] if len(self.aggregates) == self.lag else None
        return replay(inputs.codec, inputs.window, old)


class OldReplayer(Replayer):
    name, lag = "oldreplayer", REPLAY_LAG


class SelfReplay(Behaviour):
    """Trains once, in its first window, then uploads that update again in every window."""

    name = "selfreplay"

    def __init__(self) -> None:
        self.first: Update | None = None

    def plan(self, window: int, foresight: Foresight | None = None) -> Plan:
        return Plan(train=self.first is None)

    def upload(self, inputs: Inputs) -> Update | None:
        if self.first is None:
            self.first = inputs.own
        return self.first


class PartTime(Behaviour):
    """Trains one window in ``every``; in the others it replays its last trained update (or uploads zeros)."""

    name, every, zeros_between = "parttime2", 2, False

    def __init__(self) -> None:
        self.last: Update | None = None

    def plan(self, window: int, foresight: Foresight | None = None) -> Plan:
        return Plan(train=window % self.every == 0)

    def upload(self, inputs: Inputs) -> Update | None:
        if inputs.own is not None:
            self.last = inputs.own
            return inputs.own
        return zeros(inputs.codec, inputs.window) if self.zeros_between else self.last


class PartTime3(PartTime):
    name, every = "parttime3", 3


class PartTime5(PartTime):
    name, every = "parttime5", 5


class PartTime2Zeros(PartTime):
    name, zeros_between = "parttime2z", True
