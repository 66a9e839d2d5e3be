"""The contract every Chain backend must meet, run against each backend.

LocalChain always runs.  A real subtensor runs when the environment names one:

    DSO_TEST_SUBTENSOR=ws://127.0.0.1:9944  DSO_TEST_NETUID=2
    DSO_TEST_WALLET_NAME=alice  DSO_TEST_WALLET_HOTKEY=default  [DSO_TEST_WALLET_PATH=~/.bittensor/wallets]

(the hotkey must already be registered on that subnet; the test commits a
commitment and, if the hotkey holds a permit, sets a self-weight).  The third
backend is BittensorChain on the SDK's offline seam (``substrate=`` an
in-memory subtensor), which checks the SDK mapping end to end without a node.
"""
from __future__ import annotations

import math
import os
import secrets
import time
from dataclasses import dataclass
from typing import Any

import pytest

from dso.chain.base import Chain, ChainError, Neuron
from dso.chain.local_burn import FREE_REGISTRATION
from dso.chain.wallets import dev_wallet, hotkey_address


@dataclass
class Backend:
    chain: Chain
    wallet: Any
    seconds_per_block: float


def _local(tmp_path) -> Backend:
    from dso.chain.local import LocalChain

    chain = LocalChain.create(tmp_path / "chain.sqlite", block_time=0.05, genesis=time.time() - 5,
                              tempo=5, commit_interval_blocks=0, **FREE_REGISTRATION)
    wallet = dev_wallet("//contract")
    chain.register(wallet)
    chain.add_stake(hotkey_address(wallet), 10.0)
    return Backend(chain, wallet, 0.05)


def _bittensor() -> Backend:
    url, netuid = os.environ.get("DSO_TEST_SUBTENSOR"), os.environ.get("DSO_TEST_NETUID")
    name = os.environ.get("DSO_TEST_WALLET_NAME")
    if not (url and netuid and name):
        pytest.skip("no real subtensor configured: set DSO_TEST_SUBTENSOR (ws URL), DSO_TEST_NETUID and "
                    "DSO_TEST_WALLET_NAME[/_HOTKEY/_PATH] for a hotkey registered on that subnet")
    from dso.chain.bittensor_chain import BittensorChain
    from dso.chain.wallets import load_wallet
    from dso.config.schema import WalletConfig

    defaults = WalletConfig()
    wallet = load_wallet(WalletConfig(name, os.environ.get("DSO_TEST_WALLET_HOTKEY", defaults.hotkey),
                                      os.environ.get("DSO_TEST_WALLET_PATH", defaults.path)))
    chain = BittensorChain(url, int(netuid))
    return Backend(chain, wallet, chain.seconds_per_block())


def _bittensor_offline(monkeypatch, tmp_path) -> Backend:
    import bittensor as bt

    from dso.chain.bittensor_chain import BittensorChain
    from fake_substrate import FakeSubstrate

    monkeypatch.setenv("BTCLI_TOKEN_SYMBOLS_CACHE", str(tmp_path / "symbols.json"))  # SDK cache, kept out of ~
    fake = FakeSubstrate(netuid=7, block_time=0.05)
    wallet = dev_wallet("//contract")
    fake.add_neuron(hotkey_address(dev_wallet("//other")))
    fake.add_neuron(hotkey_address(wallet), stake_tao=10.0)
    return Backend(BittensorChain("local", 7, client=bt.SyncClient("local", substrate=fake)), wallet, 0.05)


@pytest.fixture(params=["local", "bittensor-offline", "bittensor"])
def backend(request, tmp_path, monkeypatch):
    if request.param == "local":
        made = _local(tmp_path)
    elif request.param == "bittensor-offline":
        made = _bittensor_offline(monkeypatch, tmp_path)
    else:
        made = _bittensor()
    yield made
    made.chain.close()


def _wait_for_block(chain: Chain, target: int, seconds_per_block: float) -> None:
    deadline = time.time() + 5 * seconds_per_block + 30
    while chain.block() < target:
        assert time.time() < deadline, f"chain did not reach block {target}"
        time.sleep(min(seconds_per_block / 2, 1.0))


def test_blocks_advance_and_timestamps_follow_them(backend):
    chain = backend.chain
    b0 = chain.block()
    assert isinstance(b0, int) and b0 > 0
    _wait_for_block(chain, b0 + 1, backend.seconds_per_block)
    t0, t1 = chain.block_timestamp(b0), chain.block_timestamp(b0 + 1)
    assert t0 < t1 <= time.time() + 60  # clocks of different machines differ by seconds at most
    assert chain.block_timestamp(chain.block() + 100) > time.time()  # scheduled time of a future block


def test_randomness_is_32_fixed_bytes_and_refused_for_future_blocks(backend):
    chain = backend.chain
    b = chain.block() - 1
    r = chain.randomness(b)
    assert isinstance(r, bytes) and len(r) == 32
    assert chain.randomness(b) == r != chain.randomness(b - 1)
    with pytest.raises(ChainError) as e:
        chain.randomness(chain.block() + 1000)
    assert e.value.reason == "future_block"


def test_registration_is_idempotent_and_shows_in_the_metagraph(backend):
    chain, hotkey = backend.chain, hotkey_address(backend.wallet)
    uid = chain.register(backend.wallet)
    assert chain.register(backend.wallet) == uid == chain.uid_of(hotkey)
    graph = chain.metagraph()
    assert all(isinstance(n, Neuron) for n in graph)
    assert [n.uid for n in graph] == sorted({n.uid for n in graph})
    me = next(n for n in graph if n.uid == uid)
    assert me.hotkey == hotkey and me.stake >= 0 and 0 <= me.incentive <= 1
    assert math.fsum(n.incentive for n in graph) <= 1 + 1e-3
    leader = chain.leading_validator()
    assert leader is None or leader.validator_permit


def test_a_commitment_reads_back_for_its_uid(backend):
    chain = backend.chain
    uid = chain.register(backend.wallet)
    data = f"dso-contract|{secrets.token_hex(8)}"
    chain.commit(backend.wallet, data)
    assert chain.commitments()[uid] == data == chain.commitment(uid)


@pytest.mark.parametrize("bad", ["", "two\nlines", "caf\u00e9", "x" * 385, None])
def test_malformed_or_oversize_commitments_are_refused_before_anything_is_written(backend, bad):
    chain = backend.chain
    uid = chain.register(backend.wallet)
    before = chain.commitment(uid)
    with pytest.raises(ChainError) as e:
        chain.commit(backend.wallet, bad)
    assert e.value.reason in ("bad_commitment", "too_large") and str(e.value)
    assert chain.commitment(uid) == before


@pytest.mark.parametrize("uids, weights", [([0], [float("nan")]), ([0], [-1.0]), ([0, 1], [1.0]),
                                           ([0], [float("inf")]), ([0, 0], [1.0, 1.0])])
def test_bad_weight_vectors_are_refused(backend, uids, weights):
    with pytest.raises(ChainError) as e:
        backend.chain.set_weights(backend.wallet, uids, weights)
    assert e.value.reason == "bad_weights"


def test_a_validators_weights_read_back_normalised(backend):
    chain = backend.chain
    uid = chain.register(backend.wallet)
    if not next(n for n in chain.metagraph() if n.uid == uid).validator_permit:
        pytest.skip("the test hotkey holds no validator permit on this subnet")
    chain.set_weights(backend.wallet, [uid], [3.0])
    assert chain.weights()[uid] == pytest.approx({uid: 1.0})
