"""A second network run against the same S3 store behaves like a run on a fresh store.

Object keys used to carry only the window and the protocol version, and a new chain starts again at window 0:
a second run on a reused store read the first run's ledger, aggregates and checkpoints, its miners decided
falsely that they had diverged and ended on another model than their validator.  Every protocol object now
lives under the run id the leading validator publishes (storage/keys.py), so the second run starts from θ_0,
its miners hold the validator's model after every window, and nothing of the first run is read.

Both runs use the ``gauntlet`` profile (configs/gauntlet.toml): the mission's pipeline as the paper has it, one
gradient per window, DCT top-k and the signed outer step, run by real processes end to end.

The shared store is the session's SeaweedFS server (``LocalNet(s3=...)`` leaves it running), so the same two runs
show that a network runs with every bucket on SeaweedFS instead of moto: the corpus in its dataset bucket, every
node reading it from there, weights on the chain and one model.  (One pair of networks for both claims: each
network costs most of a minute of start-up and windows on two cores.)
"""
from __future__ import annotations

import pytest

from dso.config.sources import use_profile
from dso.nn.model import build_model, model_hash
from sim.localnet import LocalNet, plan_nodes, wait_for

WINDOWS = 8
JOINING = 4  # windows a miner may spend starting up and joining the run (a loaded machine, training miners)


def posted_row(net: LocalNet) -> dict[int, float]:
    validator = next(n for n in net.nodes if n.role == "validator")
    return net.chain.weights().get(validator.uid) or {}


def worked_enough(net: LocalNet, posted: dict[int, float]) -> bool:
    """WINDOWS scored, two of them aggregated, every miner paid by the ``posted`` row and on WINDOWS − JOINING of
    them (on a cold, loaded machine the miners join a few windows late, so their first positive scores come later:
    the run goes on for them, bounded)."""
    lines = net.validator_lines()
    scored = {line["window"] for line in lines}
    return (len(lines) >= WINDOWS and sum(bool(line["aggregated"]) for line in lines) >= 2
            and all(posted.get(m.uid, 0.0) > 0 for m in net.nodes if m.role == "miner")
            and all(sum(m["window"] in scored for m in ms) >= WINDOWS - JOINING for ms in net.miner_lines().values()))


def seaweedfs_facts(net: LocalNet, posted: dict[int, float]) -> dict:
    """What the run left on the store and in its logs, read while the store still holds the run, and the row
    ``posted`` that ended the run (a later window may pay a miner that missed it nothing)."""
    validator = next(n for n in net.nodes if n.role == "validator")
    creds = net.credentials(validator)
    return {"engine": (net.s3.name, net.s3.endpoint), "data_source": net.data_source, "data_hash": net.hp.data_hash,
            "validator_keys": [o.key.split("/", 1)[-1] for o in creds.read_client().list(creds.bucket)],
            "dataset": {o.key for o in net.s3.admin.client().list("dso-dataset", prefix=net.hp.data_hash)},
            "logs": {n.name: (net.logs / f"{n.name}.log").read_text() for n in net.nodes},
            "posted": posted,
            "miner_uids": [n.uid for n in net.nodes if n.role == "miner"]}


def run_once(root, name, s3, hp, corpus) -> tuple[list[dict], dict[str, list[dict]], str, dict]:
    net = LocalNet(root / name, hp, plan_nodes(2, [], 1), block_time=0.5, corpus=str(corpus),
                   cache_dir=str(root / "cache"), s3=s3)
    with net:
        net.prepare()
        net.start()
        rows = []  # the posted row each look saw: the last one ended the run

        def done_or_dead() -> bool:
            rows.append(posted_row(net))
            return worked_enough(net, rows[-1]) or bool(net.dead())
        done = wait_for(done_or_dead, timeout=240, step=0.5)
        logs = {p.name: p.read_text()[-2000:] for p in net.logs.glob("*.log")}
        assert done and not net.dead(), logs
        latest = net.validator_lines()[-1]["window"]
        wait_for(lambda: all(any(m["window"] >= latest for m in ms) for ms in net.miner_lines().values()), 30)
        miner_logs = "".join(p.read_text() for p in net.logs.glob("miner*.log"))
        return net.validator_lines(), net.miner_lines(), miner_logs, seaweedfs_facts(net, rows[-1])


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, stdlib_corpus, network_hparams, seaweedfs_engine):
    root = tmp_path_factory.mktemp("rerun")
    first = run_once(root, "first", seaweedfs_engine, use_profile(network_hparams(), "gauntlet"), stdlib_corpus)
    second = run_once(root, "second", seaweedfs_engine, use_profile(network_hparams(), "gauntlet"), stdlib_corpus)
    return first, second


def test_the_second_run_starts_from_theta_0(two_runs, network_hparams):
    hp = use_profile(network_hparams(), "gauntlet")
    theta_0 = model_hash(build_model(hp.model, hp.seed))
    for lines, _, _, _ in two_runs:
        assert lines[0]["model_hash_before"] == theta_0


def test_miners_of_the_second_run_hold_the_validators_model_and_never_diverge(two_runs):
    _, (lines, miners, miner_logs, _) = two_runs
    reference = {line["window"]: line["model_hash"] for line in lines}
    for name, records in miners.items():
        followed = [r for r in records if r["window"] in reference]
        assert len(followed) >= WINDOWS - JOINING, (name, records)
        for record in followed:
            assert record["model_hash"] == reference[record["window"]], (name, record["window"])
    assert "diverged" not in miner_logs and "not at model_hash_before" not in miner_logs


def test_the_gauntlet_pipeline_moved_the_model(two_runs):
    """The signed step of the miners' DCT top-k gradients was applied: θ changed in every window that aggregated
    an update (the first windows may have none while the miners join)."""
    for lines, _, _, _ in two_runs:
        aggregated = [line for line in lines if line["aggregated"]]
        assert len(aggregated) >= 2, [(line["window"], line["aggregated"]) for line in lines]
        assert all(line["model_hash"] != line["model_hash_before"] for line in aggregated)


def test_the_runs_ran_on_seaweedfs(two_runs, seaweedfs_engine):
    """Every bucket, the dataset bucket too, lived on the SeaweedFS server, and every node read the corpus from
    there; the validator's bucket holds its checkpoints and aggregates."""
    for _, _, _, facts in two_runs:
        assert facts["engine"] == ("seaweedfs", seaweedfs_engine.endpoint)
        keys = facts["validator_keys"]
        assert any(k.startswith("checkpoint") or k.startswith("aggregate") for k in keys), keys
        assert facts["data_source"] == f"s3://dso-dataset/{facts['data_hash']}"
        assert {f"{facts['data_hash']}/manifest.json", f"{facts['data_hash']}/shard-00000.chunks"} <= facts["dataset"]
        for name, log in facts["logs"].items():
            assert f" from {facts['data_source']}, hparams " in log, name


def test_weights_on_seaweedfs_pay_every_miner(two_runs):
    """The row the validator posted to the chain pays every miner (that the miners hold its model after every
    window is the test above)."""
    for _, _, _, facts in two_runs:
        posted = facts["posted"]
        assert posted and sum(posted.values()) == pytest.approx(1.0), posted
        assert all(posted.get(uid, 0.0) > 0 for uid in facts["miner_uids"]), posted
