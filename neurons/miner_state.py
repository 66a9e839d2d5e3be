"""A miner's training parts — the error feedback and the inner loop — and their state across restarts."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

import torch

from dso.codec.demo import ErrorFeedback
from dso.training.inner import InnerLoop
from dso.training.window_training import Feedback as WindowFeedback
from neurons.context import NodeContext
from neurons.persist import load_tensors, save_tensors

log = logging.getLogger("dso.miner")


class Feedback(WindowFeedback, Protocol):
    """The miner's error feedback (:class:`dso.training.window_training.Feedback`), whose buffers it keeps across
    restarts."""

    def state(self) -> dict[str, torch.Tensor]: ...

    def load_state(self, tensors: dict[str, torch.Tensor], /) -> bool: ...


class MinerState:
    """What :class:`neurons.miner.Miner` trains with (one process: the node's model; neurons/miner_ranks.py: slices
    on every rank) and keeps between restarts."""

    ctx: NodeContext
    feedback: Feedback
    inner: InnerLoop

    def training_parts(self) -> tuple[Feedback, InnerLoop]:
        """The error feedback and the inner loop this miner trains with (one process: the node's model)."""
        return ErrorFeedback(self.ctx.codec, self.ctx.hp.ef_beta, self.ctx.device), InnerLoop(self.ctx.model,
                                                                                              self.ctx.hp)

    def state_files(self) -> tuple[Path, Path]:
        """Where the error feedback and the inner optimiser's state are kept."""
        return self.ctx.state_dir / "error_feedback.safetensors", self.ctx.state_dir / "inner_state.safetensors"

    def restore_state(self) -> None:
        """Load the miner's own state saved by :meth:`save_state` (a fresh one where it does not fit)."""
        ef_file, inner_file = self.state_files()
        saved = load_tensors(ef_file)
        if saved is not None and self.feedback.load_state(saved):
            log.info("restored the error-feedback buffer from %s", ef_file)
        saved = load_tensors(inner_file)
        if saved is not None and self.inner.load_state(saved):
            log.info("restored the inner optimiser's state from %s (%d steps so far)", inner_file,
                     self.inner.step_count)

    def save_state(self) -> None:
        """The miner's own state, kept across restarts: error feedback and the inner optimiser."""
        ef_file, inner_file = self.state_files()
        save_tensors(ef_file, self.feedback.state())
        save_tensors(inner_file, self.inner.state())
