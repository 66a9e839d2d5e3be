"""Behaviours that do the honest compute on the wrong data: another uid's assignment, one fixed batch, another
text."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from sim.behaviours.base import FIXED_BATCH, OTHER_DATA_UID, Behaviour

if TYPE_CHECKING:
    from dso.data.dataset import Dataset


class WrongData(Behaviour):
    """The honest compute on sequences that are not its assignment (another uid's, which no miner has)."""

    name = "wrongdata"

    def training_data(self, dataset: Dataset, uid: int, window: int, assigned: int) -> torch.Tensor:
        return dataset.assigned(OTHER_DATA_UID + uid, window, assigned)


class FixedBatch(Behaviour):
    """The honest compute with every inner step on one fixed batch of sequences that were never its assignment."""

    name = "fixedbatch"

    def training_data(self, dataset: Dataset, uid: int, window: int, assigned: int) -> torch.Tensor:
        batch = dataset.assigned(OTHER_DATA_UID + uid, 0, assigned)[:FIXED_BATCH]
        return batch.repeat(math.ceil(assigned / FIXED_BATCH), 1)[:assigned]


class OtherText(Behaviour):
    """The honest compute on another text: CPython's documentation prose (``dso.data.corpus.stdlib_prose``), cut into
    sequences by the run's tokeniser, a fresh stretch every window."""

    name = "othertext"

    def __init__(self) -> None:
        self.ids: np.ndarray | None = None

    def training_data(self, dataset: Dataset, uid: int, window: int, assigned: int) -> torch.Tensor:
        if self.ids is None:
            from dso.data.corpus import stdlib_prose
            self.ids = dataset.tokenizer.encode_long(stdlib_prose().read_text(errors="replace")).astype(np.int64)
        width = dataset.seq_len + 1
        rows = self.ids[: self.ids.size // width * width].reshape(-1, width)
        pick = np.random.default_rng([uid, window]).permutation(rows.shape[0])[:assigned]
        return torch.from_numpy(rows[np.resize(pick, assigned)])
