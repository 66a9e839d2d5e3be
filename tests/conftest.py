"""Shared fixtures: one torch thread, a tiny model, and a corpus from the standard library."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def stdlib_corpus() -> Path:
    """About 700 KB of English prose shipped with CPython (no install needed)."""
    import pydoc_data

    return Path(pydoc_data.__file__).parent / "topics.py"


@pytest.fixture
def tiny_hparams():
    from dso.config import HParams, ModelConfig

    hp = HParams(model=ModelConfig(d_model=32, n_layers=1, n_heads=2, ffn_hidden=64, seq_len=16))
    hp.batch_size, hp.micro_batch, hp.chunk, hp.topk = 4, 4, 16, 8
    return hp
