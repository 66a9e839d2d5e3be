"""Several validators: three of different stakes score the same miners, and killing the leader hands over.

Before the kill every validator holds the leader's θ after every window (they apply its bundles) and posts
weights.  After the leading validator is killed outright, the next by stake leads once the chain sees the
first one idle: it already holds every bundle (it republishes the ones it applied), so miners keep the
network's model.  Who leads a window is decided at its last block, the same for every node, so no miner
falls out of sync; they only miss the windows of the hand-over.
"""
from __future__ import annotations

import signal

import pytest

from sim.agreement import TARGET_MEAN_L1, weight_agreement
from sim.localnet import LocalNet, plan_nodes, wait_for

KILL_AFTER = 8     # windows the first leader scores before it is killed
AFTER_KILL = 14    # windows the second validator scores after that (the hand-over has taken five to eight)


def by_window(lines: list[dict], key: str) -> dict[int, object]:
    return {line["window"]: line[key] for line in lines}


@pytest.fixture(scope="module")
def handover(tmp_path_factory, stdlib_corpus, network_hparams):
    root = tmp_path_factory.mktemp("validators")
    net = LocalNet(root / "run", network_hparams(), plan_nodes(3, [], 3), block_time=0.5, corpus=str(stdlib_corpus),
                   cache_dir=str(root / "cache"))
    with net:
        net.prepare()
        net.start()
        logs = lambda: {p.name: p.read_text()[-2500:] for p in net.logs.glob("*.log")}  # noqa: E731
        assert wait_for(lambda: len(net.validator_lines("validator0")) >= KILL_AFTER or bool(net.dead()),
                        timeout=240, step=0.5), logs()
        assert not net.dead(), logs()
        before = {name: net.validator_lines(name) for name in ("validator0", "validator1", "validator2")}
        leader = next(n for n in net.nodes if n.name == "validator0")
        killed_at = before["validator0"][-1]["window"]
        net.stop_node(leader, signal.SIGKILL)
        done = wait_for(lambda: sum(line["window"] > killed_at for line in net.validator_lines("validator1"))
                        >= AFTER_KILL or len(net.dead()) > 1, timeout=240, step=0.5)
        assert done and net.dead() == [leader], logs()
        latest = net.validator_lines("validator1")[-1]["window"]
        wait_for(lambda: all(any(m["window"] >= latest for m in ms) for ms in net.miner_lines().values()), 40)
        yield before, {name: net.validator_lines(name) for name in ("validator1", "validator2")}, \
            net.miner_lines(), killed_at


def test_validators_hold_the_leaders_model_and_post_weights(handover):
    before, _, _, _ = handover
    reference = by_window(before["validator0"], "model_hash")
    for name in ("validator1", "validator2"):
        mine = by_window(before[name], "model_hash")
        shared = sorted(set(mine) & set(reference))
        assert len(shared) >= KILL_AFTER - 3, (name, sorted(mine), sorted(reference))
        assert all(mine[w] == reference[w] for w in shared), name
        assert any(sum(line["weights"].values()) > 0.99 for line in before[name]), f"{name} never weighted"


def test_after_the_leader_is_killed_the_next_leads_and_no_miner_falls_out_of_sync(handover):
    _, after, miners, killed_at = handover
    reference = by_window(after["validator1"], "model_hash")
    # the third validator may go its own way in the windows without a leader, then takes the new leader's model
    third = by_window(after["validator2"], "model_hash")
    settled = [w for w in sorted(third) if w > killed_at + AFTER_KILL // 2 and w in reference]
    assert settled and all(third[w] == reference[w] for w in settled), (third, reference)
    for name, lines in miners.items():
        # the leader of each window is decided at its last block, the same for every node: a window whose
        # leader of record is dead is missed (no bundle: the miner keeps θ_t), never forked
        followed = [line for line in lines if line["window"] > killed_at and line["window"] in reference
                    and str(line.get("aggregated", "")).startswith("applied")]
        assert len(followed) >= AFTER_KILL - 9, (name, [line["window"] for line in lines])
        for line in followed:
            assert line["model_hash"] == reference[line["window"]], (name, line["window"])


def test_weights_of_the_validators_agree(handover):
    """How far the validators' rows are apart (mean pairwise L1 over the windows all three weighted before the
    kill).  They hold the same model and draw S_t and the evaluation data from the same public eval seed, so
    only what each one managed to gather may differ; the target is ≤ 0.1 (docs/protocol.md)."""
    before, _, _, _ = handover
    got = weight_agreement(before, last=10)
    assert got["last_windows"] >= 2, got
    assert got["mean_l1_last"] <= TARGET_MEAN_L1, got
