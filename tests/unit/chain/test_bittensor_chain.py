"""BittensorChain's mapping onto the SDK, checked offline through its ``substrate=`` seam, and the factory."""
from __future__ import annotations

import bittensor as bt
import pytest

from chain_helpers import hk
from dso.chain.base import ChainError, ChainUnavailable, WeightRules
from dso.chain.bittensor_chain import BittensorChain
from dso.chain.factory import open_chain
from dso.chain.local import LocalChain
from dso.chain.roles import VALIDATOR, with_role
from dso.chain.wallets import dev_wallet
from dso.config.schema import Config
from fake_substrate import FakeSubstrate


@pytest.fixture
def fake(monkeypatch, tmp_path):
    monkeypatch.setenv("BTCLI_TOKEN_SYMBOLS_CACHE", str(tmp_path / "symbols.json"))
    return FakeSubstrate(netuid=5, head=2000, block_time=12.0)


def on(fake: FakeSubstrate) -> BittensorChain:
    return BittensorChain("test", 5, client=bt.SyncClient("test", substrate=fake))


A, B, C = dev_wallet("//sdkA"), dev_wallet("//sdkB"), dev_wallet("//sdkC")


def test_metagraph_maps_rao_u16_and_permits(fake):
    fake.add_neuron(hk(A), stake_tao=1234.5, incentive=0.0)
    fake.add_neuron(hk(B), incentive=0.25, emission_tao=0.75)
    graph = on(fake).metagraph()
    assert [(n.uid, n.hotkey, n.validator_permit) for n in graph] == [(0, hk(A), True), (1, hk(B), False)]
    assert graph[0].stake == 1234.5 and graph[1].stake == 0.0
    assert graph[1].incentive == pytest.approx(round(0.25 * 65535) / 65535) and graph[1].emission == 0.75
    assert on(fake).uid_of(hk(B)) == 1 and on(fake).uid_of(hk(C)) is None
    fake.subnet_exists = False
    with pytest.raises(ChainError) as e:
        on(fake).metagraph()
    assert e.value.reason == "no_subnet"


def test_commitments_concatenate_raw_fields_and_skip_deregistered_hotkeys(fake):
    fake.add_neuron(hk(A))
    fake.add_neuron(hk(B))
    long = "dso1|" + "k" * 200
    raw = long.encode()
    fake.commitment_of = {
        hk(B): {"block": 1990, "deposit": 0,
                "info": {"fields": [{f"Raw{len(raw[i:i + 128])}": "0x" + raw[i:i + 128].hex()}
                                    for i in range(0, len(raw), 128)]}},
        hk(C): {"block": 1980, "deposit": 0, "info": {"fields": [{"Raw4": "0x" + b"gone".hex()}]}},
    }
    assert on(fake).commitments() == {1: long}


def test_commit_sends_raw_fields_signed_by_the_hotkey_once(fake):
    fake.add_neuron(hk(A))
    chain = on(fake)
    data = "dso1|" + "s" * 250
    chain.commit(A, data)
    chain.commit(A, data)  # unchanged: no second extrinsic, no fee
    assert len(fake.submitted) == 1
    call, signer = fake.submitted[0]
    assert (call.module, call.function, call.params["netuid"]) == ("Commitments", "set_commitment", 5)
    fields = call.params["info"]["fields"]
    assert [next(iter(f)) for f in fields] == ["Raw128", "Raw127"]
    assert b"".join(next(iter(f.values())) for f in fields) == data.encode()
    assert signer == hk(A)  # the hotkey signs, never the coldkey
    assert chain.commitments() == {0: data}
    with pytest.raises(ChainError) as e:
        chain.commit(A, "x" * 385)
    assert e.value.reason == "too_large" and len(fake.submitted) == 1


def test_set_weights_sends_u16_weights_for_the_subnet(fake):
    fake.add_neuron(hk(A), stake_tao=5.0)
    fake.add_neuron(hk(B))
    fake.add_neuron(hk(C))
    chain = on(fake)
    chain.set_weights(A, [1, 2], [1.0, 3.0])
    call, signer = fake.submitted[-1]
    assert (call.function, call.params["netuid"], signer) == ("set_mechanism_weights", 5, hk(A))
    assert call.params["dests"] == [1, 2] and call.params["weights"] == [21845, 65535]  # max-upscaled u16
    assert chain.weights() == {0: pytest.approx({1: 0.25, 2: 0.75}, abs=1e-4)}


def test_time_and_randomness_come_from_the_chain(fake):
    chain = on(fake)
    assert chain.block() == 2000
    assert chain.block_timestamp(2000) - chain.block_timestamp(1990) == pytest.approx(120.0)
    assert chain.block_timestamp(2010) - chain.block_timestamp(2000) == pytest.approx(120.0)  # extrapolated
    assert chain.randomness(1999) == (1999).to_bytes(32, "big")[::-1]  # the block hash
    with pytest.raises(ChainError) as e:
        chain.randomness(2001)
    assert e.value.reason == "future_block"


def test_sdk_failures_become_chain_errors(fake, monkeypatch):
    fake.add_neuron(hk(A))
    chain = on(fake)
    with pytest.raises(ChainError) as e:
        chain.register(B)
    assert e.value.reason == "not_registered" and "btcli subnets register --netuid 5" in str(e.value)
    assert fake.submitted == []  # registration costs TAO: never without being asked

    async def refuse(call, keypair, **kw):
        return bt.ExtrinsicResult(success=False, error=bt.ChainError("space used up", name="SpaceLimitExceeded"))
    monkeypatch.setattr(fake, "submit", refuse)
    with pytest.raises(ChainError) as e:
        chain.commit(A, "new")
    assert e.value.reason == "rate_limited"

    async def down():
        raise bt.RpcConnectionError("connection refused")
    monkeypatch.setattr(fake, "block_number", down)
    with pytest.raises(ChainUnavailable):
        chain.block()
    with pytest.raises(ChainError) as e:
        chain.append_ledger(A, {"x": 1})
    assert e.value.reason == "unsupported"


def test_factory_picks_the_backend_from_the_config(tmp_path):
    cfg = Config()
    cfg.subtensor.localchain_path = str(tmp_path / "chain.sqlite")
    with pytest.raises(ChainUnavailable, match="scripts/localnet.py"):
        open_chain(cfg)
    LocalChain.create(cfg.subtensor.localchain_path).close()
    chain = open_chain(cfg)
    assert isinstance(chain, LocalChain)
    chain.close()
    cfg.subtensor.network, cfg.netuid = "finney", 9
    chain = open_chain(cfg)  # cold: no connection is made until the first call
    assert isinstance(chain, BittensorChain) and (chain.network, chain.netuid) == ("finney", 9)
    cfg.subtensor.network = "nowhere"
    with pytest.raises(ChainError) as e:
        open_chain(cfg)
    assert e.value.reason == "bad_input"


# ------------------------------------------------------------------ the real chain's rules
def test_weight_rules_read_the_subnet_hyperparameters(fake):
    assert on(fake).weight_rules() == WeightRules()  # nothing set: no limits, full max weight
    fake.hyper = {"WeightsSetRateLimit": 100, "MinAllowedWeights": 8, "MaxWeightsLimit": 32767,
                  "WeightsVersionKey": 2012, "CommitRevealWeightsEnabled": True, "RevealPeriodEpochs": 1}
    got = on(fake).weight_rules()
    assert (got.rate_limit_blocks, got.min_allowed_weights, got.version_key) == (100, 8, 2012)
    assert got.max_weight_limit == pytest.approx(0.5, abs=1e-4) and got.commit_reveal and got.reveal_period_epochs == 1


def test_set_weights_posts_the_configured_version_key(fake, tmp_path):
    fake.add_neuron(hk(A), stake_tao=5.0)
    fake.add_neuron(hk(B))
    chain = BittensorChain("test", 5, client=bt.SyncClient("test", substrate=fake), weights_version=2012)
    chain.set_weights(A, [1], [1.0])
    assert fake.submitted[-1][0].params["version_key"] == 2012
    chain.set_weights(A, [1], [1.0], version_key=7)
    assert fake.submitted[-1][0].params["version_key"] == 7
    assert chain.metagraph()[0].last_update == 2000  # the post is the neuron's last update
    cfg = Config()
    cfg.subtensor.network, cfg.netuid, cfg.subtensor.weights_version = "finney", 9, 31
    assert open_chain(cfg).weights_version == 31  # from --subtensor.weights_version


def test_randomness_reads_only_the_block_hash(fake):
    chain = on(fake)
    assert chain.randomness(1990) == (1990).to_bytes(32, "big")[::-1]
    assert fake.blocks_decoded == 0  # one storage read, no block fetched and decoded
    fake.keeps_hashes = 5  # an old block: the hash map no longer holds it, the block header does
    assert chain.randomness(1990) == (1990).to_bytes(32, "big")[::-1] and fake.blocks_decoded == 1


def test_protocol_validators_are_the_tagged_permit_holders(fake):
    fake.add_neuron(hk(A), stake_tao=10.0)  # runs the protocol
    fake.add_neuron(hk(B), stake_tao=50.0)  # a third-party validator: more stake, no tag
    fake.add_neuron(hk(C))                  # a miner
    chain = on(fake)
    base = "dso1|https://s3.example.com|auto|dso-x|KEY|secret"
    fake.commitment_of = {hk(A): _raw(with_role(base, VALIDATOR)), hk(B): _raw(base), hk(C): _raw(base)}
    assert [n.uid for n in chain.protocol_validators()] == [0]
    assert chain.leading_validator().uid == 1 and chain.leading_protocol_validator().uid == 0


def _raw(text: str) -> dict:
    raw = text.encode()
    return {"block": 1990, "deposit": 0, "info": {"fields": [{f"Raw{len(raw[i:i + 128])}": "0x" + raw[i:i + 128].hex()}
                                                               for i in range(0, len(raw), 128)]}}


def test_state_reads_can_be_pinned_to_a_block(fake):
    """The leader of a window is decided from the state at its last block: the SDK read is pinned."""
    fake.add_neuron(hk(A), stake_tao=10.0)
    chain = on(fake)
    chain.metagraph(), chain.commitments()
    chain.metagraph(1990), chain.commitments(1990)
    assert fake.read_at == [("metagraph", 2000), ("commitments", 2000), ("metagraph", 1990), ("commitments", 1990)]
