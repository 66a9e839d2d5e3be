"""Applying the leader's bundle off the training thread (issue 13: miners use their whole window).

A miner trains window t+1 from θ_t while window t's bundle is on its way (neurons/miner.py,
``train_ahead``).  Applying the bundle — decoding every aggregated payload, the outer step, two model
hashes — takes a CPU-second or more on a shared machine; done between two inner steps it leaves the
training idle for that long.  :class:`BackgroundApply` does it on a thread, on a copy of θ_t (the
inner loop's anchor) and of the outer state, while the inner steps go on; the miner swaps the result
in between two steps.  Nothing is shared with the training thread but read-only inputs, so a bundle
that fails to apply leaves the miner's own model and outer state as they were.
"""
from __future__ import annotations

import copy
import threading
from typing import Callable, Mapping

import torch

from dso.outer import OuterState
from dso.rejections import Rejection
from storage.aggregate import Bundle

Apply = Callable[[torch.nn.Module, OuterState, Bundle | Rejection], tuple[bool, str]]


class BackgroundApply:
    """One bundle applied to a copy of θ_t on its own thread: :meth:`start`, then :meth:`done` / :meth:`result`."""

    def __init__(self, scratch: torch.nn.Module, apply: Apply):
        self.scratch = scratch          # a model of the same shape, overwritten with θ_t
        self.apply = apply
        self.outer: OuterState | None = None
        self.thread: threading.Thread | None = None
        self.outcome: tuple[bool, str] = (False, "no bundle applied")

    @property
    def started(self) -> bool:
        return self.thread is not None

    def start(self, got: Bundle | Rejection, theta: Mapping[str, torch.Tensor], outer: OuterState) -> None:
        """Apply ``got`` to copies of ``theta`` (θ_t) and ``outer``, on a thread."""
        with torch.no_grad():
            for name, p in self.scratch.named_parameters():
                p.copy_(theta[name])
        self.outer = copy.deepcopy(outer)
        self.thread = threading.Thread(target=self._run, args=(got, self.outer), name="bundle-apply", daemon=True)
        self.thread.start()

    def _run(self, got: Bundle | Rejection, outer: OuterState) -> None:
        try:
            self.outcome = self.apply(self.scratch, outer, got)
        except Exception as e:  # never lost on a thread: the miner reads it as a failed apply
            self.outcome = (False, f"applying the bundle failed: {type(e).__name__}: {e}")

    def done(self) -> bool:
        return self.thread is not None and not self.thread.is_alive()

    def result(self) -> tuple[bool, str]:
        """(applied, summary), once the thread ended; (False, …) if it was never started."""
        if self.thread is not None:
            self.thread.join()
        return self.outcome

    @torch.no_grad()
    def theta_next(self) -> dict[str, torch.Tensor]:
        """θ_{t+1}, after a successful apply."""
        return {n: p.detach() for n, p in self.scratch.named_parameters()}
