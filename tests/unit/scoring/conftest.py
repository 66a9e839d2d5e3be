"""Fixtures for the scoring tests (the scripted miners are in mininet.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dso.data.dataset import Dataset
from paper_training import use_paper_training


@pytest.fixture
def hp(tiny_hparams):
    hp = tiny_hparams
    hp.warmup_windows = 0
    hp.learning_rate = 1e-2
    hp.sync_samples = 16
    hp.eval_sequences = 4
    hp.eval_peers = 4
    hp.fast_peers = 8
    hp.topg = 3
    # the scripted miners send one gradient per window: the paper's mode, scored with the signed rule
    use_paper_training(hp)
    # one gradient of four sequences leaves too faint a trace for the proof of computation to be decisive on this
    # model: these tests check the scoring's machinery, with a lenient test that still fails an update that is
    # worse than nothing on its data (its calibration is the seeded simulator's: tests/integration/sim)
    hp.poc_threshold, hp.poc_cooldown = -1.0, 2
    return hp


@pytest.fixture(scope="session")
def dataset(stdlib_corpus: Path) -> Dataset:
    ids = np.frombuffer(stdlib_corpus.read_bytes(), dtype=np.uint8).copy()
    return Dataset(ids, "stdlib-topics", seq_len=16, seed=7, val_fraction=0.02)
