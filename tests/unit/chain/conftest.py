"""Fixtures for chain tests: a controllable clock and fresh LocalChains driven by it."""
from __future__ import annotations

import pytest

from chain_helpers import FakeClock
from dso.chain.local import LocalChain
from dso.chain.local_burn import FREE_REGISTRATION


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_chain(tmp_path, clock):
    """LocalChain factory on the fake clock: genesis 0, 1 s blocks (block 1000 at start), tempo 10, registrations
    free (the burn has its own tests, which set it)."""
    made = []

    def make(**settings) -> LocalChain:
        settings = {"genesis": 0.0, "block_time": 1.0, "tempo": 10, "commit_interval_blocks": 0, **FREE_REGISTRATION,
                    **settings}
        chain = LocalChain.create(tmp_path / f"chain{len(made)}.sqlite", clock=clock, **settings)
        made.append(chain)
        return chain

    yield make
    for chain in made:
        chain.close()
