"""Two validators that each began a run (they started at the same moment, neither saw the other) end in one.

Real validators (production wiring, the embedded S3 server, a LocalChain): the one with more stake leads run
A, the other holds run B.  The follower joins A at A's latest checkpoint (neurons/validator.py
``follow_leaders_run``); the leader never leaves its own run; a follower that cannot load the leader's
checkpoint keeps its run and model.  At first start a validator waits for a permit holder with more stake
that has published no commitment yet (it may be a protocol validator still starting: ``senior_expected``).
"""
from __future__ import annotations

import time

import pytest
import torch

from dso.chain.local import LocalChain
from dso.chain.local_burn import FREE_REGISTRATION
from dso.chain.wallets import create_local_wallet, hotkey_address
from dso.data.dataset import Dataset
from dso.nn.model import model_hash
from embedded_nodes import node_config
from embedded_nodes import tiny_node_hparams as tiny
from neurons.context import build_context
from neurons.validator import Validator
from storage import keys
from storage.checkpoint import save_checkpoint
from storage.jsonobj import put_json
from storage.server import EmbeddedS3

RUN_A, RUN_B = "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"
BLOCK_TIME = 0.2


@pytest.fixture(scope="module")
def network(tmp_path_factory, stdlib_corpus):
    """(chain, {name: Validator}, wallets dir): 'senior' (stake 1000) and 'junior' (stake 500), both built."""
    root = tmp_path_factory.mktemp("fork")
    hp, cache = tiny(), str(root / "cache")
    hp.data_hash = Dataset.for_run(hp, str(stdlib_corpus), cache).data_hash
    with EmbeddedS3.start() as s3:
        chain = LocalChain.create(root / "chain.sqlite", block_time=BLOCK_TIME, tempo=10_000,
                                  commit_interval_blocks=0, immunity_blocks=10_000, weights_rate_limit=0,
                                  **FREE_REGISTRATION)
        wallets = str(root / "wallets")
        nodes = {}
        for name, stake in (("senior", 1000.0), ("junior", 500.0)):
            wallet = create_local_wallet(name, "default", wallets)
            chain.register(wallet)
            chain.add_stake(hotkey_address(wallet), stake)
            cfg = node_config(root, s3, name, wallets, str(stdlib_corpus), cache, hp, allow_loopback_endpoints=True)
            nodes[name] = Validator(build_context(cfg, "validator", handle_signals=False))
        yield chain, nodes, wallets


def begin(validator: Validator, run: str, seed: int) -> str:
    """The validator holds ``run`` from the current window, with a model of its own; its checkpoint published."""
    ctx = validator.ctx
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ctx.model.parameters():
            p.normal_(0, 0.02, generator=generator)
    ctx.run = run
    t = ctx.clock.current_window()
    save_checkpoint(ctx.own.client, ctx.own.bucket, ctx.model, t, ctx.hp, ctx.run, ctx.outer)
    validator.start_run(t)
    return model_hash(ctx.model)


def settle(chain: LocalChain, nodes: dict[str, Validator]) -> None:
    """Let the chain produce a block past the last write; drop the nodes' cached views of it."""
    target = chain.block() + 2
    while chain.block() < target:
        time.sleep(BLOCK_TIME / 4)
    for v in nodes.values():
        v.ctx.chain.invalidate()


def test_the_follower_joins_the_leaders_run_and_the_leader_stays(network):
    chain, nodes, wallets = network
    senior, junior = nodes["senior"], nodes["junior"]
    theirs = begin(senior, RUN_A, seed=1)
    begin(junior, RUN_B, seed=2)
    chain.set_weights(create_local_wallet("senior", "default", wallets), [senior.ctx.uid], [1.0])
    settle(chain, nodes)
    assert junior.ctx.peers.leader_uid() == senior.ctx.uid

    senior.follow_leaders_run()
    assert senior.ctx.run == RUN_A and model_hash(senior.ctx.model) == theirs

    junior.follow_leaders_run()
    assert junior.ctx.run == RUN_A and junior.book.run == RUN_A
    assert model_hash(junior.ctx.model) == theirs
    assert junior.book.model_window >= senior.book.model_window
    # it announces the run it now takes part in
    manifest = junior.ctx.own.client.get(junior.ctx.own.bucket, keys.manifest(junior.ctx.hp.protocol_version))
    assert RUN_A.encode() in manifest


def test_without_the_leaders_checkpoint_the_follower_keeps_its_run_and_model(network):
    chain, nodes, wallets = network
    senior, junior = nodes["senior"], nodes["junior"]
    begin(senior, RUN_A, seed=3)
    ours = begin(junior, RUN_B, seed=4)
    client, bucket, v = senior.ctx.own.client, senior.ctx.own.bucket, senior.ctx.hp.protocol_version
    client.delete(bucket, [keys.latest_checkpoint(v, RUN_A)])
    chain.set_weights(create_local_wallet("senior", "default", wallets), [senior.ctx.uid], [1.0])
    settle(chain, nodes)

    junior.follow_leaders_run()
    assert junior.ctx.run == RUN_B and junior.book.run == RUN_B
    assert model_hash(junior.ctx.model) == ours


def test_a_permit_holder_without_a_commitment_is_waited_for(tmp_path):
    chain = LocalChain.create(tmp_path / "chain.sqlite", block_time=BLOCK_TIME, commit_interval_blocks=0,
                              **FREE_REGISTRATION)
    wallets = str(tmp_path / "wallets")
    me, other = (create_local_wallet(n, "default", wallets) for n in ("me", "other"))
    for wallet, stake in ((me, 100.0), (other, 200.0)):
        chain.register(wallet)
        chain.add_stake(hotkey_address(wallet), stake)

    class Stub:  # senior_expected reads only ctx.chain and ctx.uid
        ctx = type("Ctx", (), {"chain": chain, "uid": chain.uid_of(hotkey_address(me))})()

    expected = lambda: Validator.senior_expected(Stub())  # type: ignore[arg-type]  # noqa: E731
    assert expected(), "a richer permit holder with no commitment may be a validator still starting"
    chain.commit(other, "dso1|http://127.0.0.1:9|us-east-1|dso-other|key|secret")  # a miner's commitment
    assert not expected(), "a richer peer that published a miner's commitment is no validator"
    chain.commit(other, "dso1|http://127.0.0.1:9|us-east-1|dso-other|key|secret|validator")
    assert expected()



def test_a_leader_with_other_settings_is_not_followed_and_stops_nothing(network):
    chain, nodes, wallets = network
    senior, junior = nodes["senior"], nodes["junior"]
    begin(senior, RUN_A, seed=5)
    ours = begin(junior, RUN_B, seed=6)
    other = senior.ctx.manifest(0)
    other["hparams_digest"], other["hparams"] = "0" * 16, {**other["hparams"], "topg": 99}
    put_json(senior.ctx.own.client, senior.ctx.own.bucket, keys.manifest(senior.ctx.hp.protocol_version), other)
    chain.set_weights(create_local_wallet("senior", "default", wallets), [senior.ctx.uid], [1.0])
    settle(chain, nodes)

    junior.follow_leaders_run()  # a warning, not a Fatal: a running validator keeps its run
    assert junior.ctx.run == RUN_B and model_hash(junior.ctx.model) == ours
