"""A short local network (2 miners, 1 validator) whose every bucket lives on SeaweedFS instead of moto.

The network runs against the session's SeaweedFS server (``LocalNet(s3=...)`` leaves it running for the other
tests); ``scripts/localnet.py --storage.engine seaweedfs`` starts one of its own the same way.
"""
from __future__ import annotations

import pytest

from sim.localnet import LocalNet, plan_nodes, wait_for

WINDOWS = 6


def every_miner_weighted(net: LocalNet) -> bool:
    validator = next(n for n in net.nodes if n.role == "validator")
    posted = net.chain.weights().get(validator.uid) or {}
    return all(posted.get(m.uid, 0.0) > 0 for m in net.nodes if m.role == "miner")


@pytest.fixture(scope="module")
def seaweed_network(tmp_path_factory, stdlib_corpus, network_hparams, seaweedfs_engine):
    root = tmp_path_factory.mktemp("seaweednet")
    net = LocalNet(root / "run", network_hparams(), plan_nodes(2, [], 1), block_time=0.5,
                   corpus=str(stdlib_corpus), cache_dir=str(root / "cache"), s3=seaweedfs_engine)
    with net:
        net.prepare()
        net.start()
        # WINDOWS scored, and a posted row that weights every miner (on a cold machine the miners may join a few
        # windows late, so their first positive scores come later: wait for them, bounded)
        ready = lambda: (len(net.validator_lines()) >= WINDOWS and every_miner_weighted(net)  # noqa: E731
                         and all(len(ls) >= WINDOWS - 3 for ls in net.miner_lines().values()))
        done = wait_for(lambda: ready() or bool(net.dead()), timeout=300, step=0.5)
        logs = {p.name: p.read_text()[-3000:] for p in net.logs.glob("*.log")}
        assert done and not net.dead(), f"network on SeaweedFS did not complete {WINDOWS} weighted windows: {logs}"
        yield net


def test_the_network_ran_on_seaweedfs(seaweed_network, seaweedfs_engine):
    net = seaweed_network
    assert net.s3.name == "seaweedfs" and net.s3.endpoint == seaweedfs_engine.endpoint
    validator = next(n for n in net.nodes if n.role == "validator")
    creds = net.credentials(validator)
    keys = [o.key.split("/", 1)[-1] for o in creds.read_client().list(creds.bucket)]
    assert any(k.startswith("checkpoint") or k.startswith("aggregate") for k in keys), keys
    # the corpus is in a dataset bucket on the same SeaweedFS server, and every node read it from there
    assert net.data_source == f"s3://dso-dataset/{net.hp.data_hash}"
    listed = {o.key for o in net.s3.admin.client().list("dso-dataset", prefix=net.hp.data_hash)}
    assert f"{net.hp.data_hash}/manifest.json" in listed and f"{net.hp.data_hash}/shard-00000.chunks" in listed
    for node in net.nodes:
        assert f" from {net.data_source}, hparams " in (net.logs / f"{node.name}.log").read_text(), node.name


def test_weights_and_models_agree_on_seaweedfs(seaweed_network):
    net = seaweed_network
    validator = next(n for n in net.nodes if n.role == "validator")
    posted = net.chain.weights().get(validator.uid)
    assert posted and all(posted.get(m.uid, 0.0) > 0 for m in net.nodes if m.role == "miner"), posted
    reference = {line["window"]: line["model_hash"] for line in net.validator_lines()}
    for name, lines in net.miner_lines().items():
        compared = [line for line in lines if line["window"] in reference]
        assert len(compared) >= WINDOWS - 3, f"{name} followed too few windows"
        assert all(line["model_hash"] == reference[line["window"]] for line in compared), name
