"""One window of a miner's training, written once for the miner, the simulator and the training benchmark.

From θ_t (or from steps of the window taken before θ_t was known, rebased onto it) the inner loop trains on the
window's sequences; its pseudo-gradient is released (the miner's differential privacy: clipped and noised, the
round counted), passed through error feedback and compressed; then the model holds θ_t again, the point every
node follows the network from.  How long to train is the caller's: the miner trains until a deadline set by its
clock (neurons/miner.py), the simulator and the benchmark a fixed number of steps.  A loop shared by several
simulated peers swaps each peer's optimiser state in and out (:attr:`Start.state`).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch

from dso.codec.demo import CompressedUpdate, Release
from dso.training.inner import InnerLoop, InnerReport


class Feedback(Protocol):
    """Error feedback and compression: :class:`dso.codec.demo.ErrorFeedback`, or on ranks
    :class:`dso.distributed.sharded_codec.ShardedFeedback` (whose non-leading ranks get no update back)."""

    def step(self, grads: Mapping[str, torch.Tensor], window: int, uid: int = 0, release: Release | None = None,
             /) -> CompressedUpdate | None: ...


# the inner steps of the window on a loop that holds its start: their report, or None when nothing is to be sent
Train = Callable[[InnerLoop], InnerReport | None]


@dataclass(frozen=True)
class Start:
    """Where a window's training begins."""

    theta: Mapping[str, torch.Tensor] | None = None  # θ_t to load; None: the model holds it (or, ahead, the steps)
    ahead: bool = False  # the model holds steps of this window taken from θ_{t-1}: rebase them onto ``theta``
    # the optimiser state to swap in (a loop shared by several peers; an empty or unfit one starts fresh);
    # None: the loop keeps its own
    state: Mapping[str, torch.Tensor] | None = None


@dataclass
class Trained:
    """What one window's training produced."""

    update: CompressedUpdate | None  # None: nothing to send (the train step said so)
    report: InnerReport = field(default_factory=InnerReport)
    state: dict[str, torch.Tensor] | None = None  # the optimiser state to keep, when ``Start.state`` swapped one in


def begin(loop: InnerLoop, start: Start) -> None:
    """Put the loop at the window's start: the peer's optimiser state, then θ_t as the anchor."""
    if start.state is not None and not loop.load_state(start.state):
        loop.fresh()
    if not start.ahead:
        loop.start(start.theta)
    elif start.theta is not None:  # local ← θ_t + (local − θ_{t-1})
        loop.rebase(start.theta)
    # else the caller rebased the steps onto θ_t already (the miner, when it applied the bundle)


def train_window(loop: InnerLoop, feedback: Feedback, window: int, uid: int, train: Train, *,
                 start: Start = Start(), release: Release | None = None) -> Trained:
    """One window: :func:`begin`, ``train``, pseudo-gradient → ``release`` → error feedback and compression,
    and the model back at θ_t."""
    begin(loop, start)
    report = train(loop)
    state = loop.state() if start.state is not None else None
    update = None if report is None else feedback.step(loop.pseudo_gradient(), window, uid, release)
    loop.restore_anchor()
    return Trained(update, report or InnerReport(), state)
