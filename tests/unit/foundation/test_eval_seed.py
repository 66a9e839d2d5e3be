"""The eval seed: randomness of a block produced only after no upload of the window can count any more."""
from __future__ import annotations

import math

import pytest

from dso.chain.base import ChainError
from dso.chain.local import LocalChain
from dso.protocol.clock import Clock


@pytest.fixture
def chain(tmp_path):
    now = [1000.0]
    chain = LocalChain.create(tmp_path / "chain.sqlite", clock=lambda: now[0], genesis=1000.0, block_time=0.5)
    return chain, now


@pytest.mark.parametrize("commit_reveal", [False, True])
def test_eval_block_comes_after_every_timely_upload(chain, commit_reveal):
    chain, now = chain
    clock = Clock(chain, blocks_per_window=12, put_window_seconds=3.2)
    for window in range(3):
        close = clock.uploads_close(window, commit_reveal)
        block = clock.eval_block(window, commit_reveal)
        # LastModified is truncated to whole seconds: an upload before ⌊close⌋ + 1 can still count
        assert chain.block_timestamp(block) >= math.floor(close) + 1
        assert chain.block_timestamp(block - 1) < math.floor(close) + 1     # the first such block
        assert block > clock.first_block(window + 1)


def test_eval_randomness_is_unknown_until_the_block_exists_then_fixed(chain):
    chain, now = chain
    clock = Clock(chain, blocks_per_window=12, put_window_seconds=3.0)
    block = clock.eval_block(0, False)
    now[0] = chain.block_timestamp(block) - 0.3                        # the put window is over, the block is not
    with pytest.raises(ChainError):
        chain.randomness(block)
    now[0] = chain.block_timestamp(block)
    seed = clock.eval_randomness(0, False)
    assert len(seed) == 32 and seed == clock.eval_randomness(0, False) == chain.randomness(block)
    assert seed != clock.window_randomness(0)
