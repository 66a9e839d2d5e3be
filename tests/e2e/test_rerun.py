"""A second network run against the same S3 store behaves like a run on a fresh store.

Object keys used to carry only the window and the protocol version, and a new chain starts again at window 0:
a second run on a reused store read the first run's ledger, aggregates and checkpoints, its miners decided
falsely that they had diverged and ended on another model than their validator.  Every protocol object now
lives under the run id the leading validator publishes (storage/keys.py), so the second run starts from θ_0,
its miners hold the validator's model after every window, and nothing of the first run is read.

Both runs use the ``gauntlet`` profile (configs/gauntlet.toml): the mission's pipeline as the paper has it, one
gradient per window, DCT top-k and the signed outer step, run by real processes end to end.
"""
from __future__ import annotations

import pytest

from dso.config.sources import use_profile
from dso.nn.model import build_model, model_hash
from sim.localnet import LocalNet, plan_nodes, wait_for
from storage.server import EmbeddedS3

WINDOWS = 8
JOINING = 4  # windows a miner may spend starting up and joining the run (a loaded machine, training miners)


def run_once(root, name, s3, hp, corpus) -> tuple[list[dict], dict[str, list[dict]], str]:
    net = LocalNet(root / name, hp, plan_nodes(2, [], 1), block_time=0.5, corpus=str(corpus),
                   cache_dir=str(root / "cache"), s3=s3)
    with net:
        net.prepare()
        net.start()
        done = wait_for(lambda: len(net.validator_lines()) >= WINDOWS or bool(net.dead()), timeout=240, step=0.5)
        logs = {p.name: p.read_text()[-2000:] for p in net.logs.glob("*.log")}
        assert done and not net.dead(), logs
        latest = net.validator_lines()[-1]["window"]
        wait_for(lambda: all(any(m["window"] == latest for m in ms) for ms in net.miner_lines().values()), 30)
        miner_logs = "".join(p.read_text() for p in net.logs.glob("miner*.log"))
        return net.validator_lines(), net.miner_lines(), miner_logs


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, stdlib_corpus, network_hparams):
    root = tmp_path_factory.mktemp("rerun")
    with EmbeddedS3.start() as store:
        first = run_once(root, "first", store, use_profile(network_hparams(), "gauntlet"), stdlib_corpus)
        second = run_once(root, "second", store, use_profile(network_hparams(), "gauntlet"), stdlib_corpus)
    return first, second


def test_the_second_run_starts_from_theta_0(two_runs, network_hparams):
    hp = use_profile(network_hparams(), "gauntlet")
    theta_0 = model_hash(build_model(hp.model, hp.seed))
    for lines, _, _ in two_runs:
        assert lines[0]["model_hash_before"] == theta_0


def test_miners_of_the_second_run_hold_the_validators_model_and_never_diverge(two_runs):
    (_, _, _), (lines, miners, miner_logs) = two_runs
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
    for lines, _, _ in two_runs:
        aggregated = [line for line in lines if line["aggregated"]]
        assert len(aggregated) >= 2, [(line["window"], line["aggregated"]) for line in lines]
        assert all(line["model_hash"] != line["model_hash_before"] for line in aggregated)
