"""Shared set-up of the simulator tests."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def simnet_hparams():
    """The simulator tests' tiny model and window sizes; a factory (each call gives a fresh object), callers set
    what their test is about (mode, learning rate, evaluation)."""
    from dso.config.schema import HParams, ModelConfig

    def make() -> HParams:
        hp = HParams(model=ModelConfig(d_model=32, n_layers=1, n_heads=2, ffn_hidden=64, seq_len=32))
        hp.batch_size, hp.assigned_sequences, hp.micro_batch, hp.chunk, hp.topk = 8, 16, 8, 16, 8
        hp.eval_sequences, hp.eval_peers, hp.warmup_windows = 8, 8, 0
        return hp
    return make
