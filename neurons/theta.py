"""What a node does with its θ to follow the network: hash it, sample it for SyncScore, take the outer step of a
bundle, load a checkpoint.

One process keeps θ in its model (:class:`WholeTheta`); a miner on several ranks keeps it as every rank's slice
(dso/distributed/sliced_theta.py, the same operations, collective).  neurons/follow.py, neurons/catchup.py,
neurons/engine.py and the miner's upload work on a :class:`Theta`, and give the same bits either way.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from dso.config.schema import HParams
from dso.nn.model import model_hash
from dso.training.outer import OuterState, apply_outer
from scoring.sync import Position, sample_parameters
from storage.checkpoint import LoadedCheckpoint


class Theta(Protocol):
    def hash(self) -> str:
        """:func:`dso.nn.model.model_hash` of θ."""

    def sample(self, positions: Sequence[Position]) -> torch.Tensor:
        """float32 values of θ at SyncScore's ``positions``."""

    def step(self, delta: Mapping[str, torch.Tensor], outer: OuterState, hp: HParams, window: int) -> float:
        """The run's outer step with the aggregate Δ (:func:`dso.training.outer.apply_outer`)."""

    def load_checkpoint(self, checkpoint: LoadedCheckpoint) -> None:
        """θ ← a verified checkpoint."""


class WholeTheta:
    """θ in one process's model."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def hash(self) -> str:
        return model_hash(self.model)

    def sample(self, positions: Sequence[Position]) -> torch.Tensor:
        return sample_parameters(dict(self.model.named_parameters()), list(positions))

    def step(self, delta: Mapping[str, torch.Tensor], outer: OuterState, hp: HParams, window: int) -> float:
        return apply_outer(dict(self.model.named_parameters()), delta, outer, hp, window)

    def load_checkpoint(self, checkpoint: LoadedCheckpoint) -> None:
        checkpoint.load_into(self.model)  # shard by shard, from the verified copies


def as_theta(theta: torch.nn.Module | Theta) -> Theta:
    """A model is its own θ (:class:`WholeTheta`)."""
    return WholeTheta(theta) if isinstance(theta, torch.nn.Module) else theta
