"""End to end: honest miners train for their whole window.

Two honest miners and a validator (the real processes, embedded S3, LocalChain) with a protocol maximum
of inner steps no miner reaches in a window, so only the clock stops training.  Each miner trains window
t+1 while the leader's bundle of window t is on its way and rebases onto it: most windows record steps
taken ahead, the utilisation (inner training seconds ÷ window seconds) is high, and every miner still
holds the validator's θ after every window.  The floor is generous (machine speed belongs in the
benchmark, docs/benchmarks.md): before the miners trained ahead it was about a third of the window.
"""
from __future__ import annotations

import pytest

from sim.localnet import LocalNet, plan_nodes, wait_for

WINDOWS = 10
FLOOR = 0.5


@pytest.fixture(scope="module")
def lines(tmp_path_factory, stdlib_corpus, network_hparams):
    root = tmp_path_factory.mktemp("utilisation")
    hp = network_hparams()
    hp.inner.steps_max, hp.assigned_sequences = 400, 400 * hp.batch_size  # the clock, not the cap, ends training
    # the corpus in the dataset bucket, as by default: a miner reads its 6,400 sequences as training reaches them
    net = LocalNet(root / "run", hp, plan_nodes(2, [], 1), block_time=0.5, corpus=str(stdlib_corpus),
                   cache_dir=str(root / "cache"), metrics=False)
    with net:
        net.prepare()
        net.start()
        # the miners may join a few windows late on a loaded machine: wait for their windows, not the validator's
        # (eight after the two they join in: a window spent catching up weighs an eighth of the mean)
        worked = lambda: all(sum("utilisation" in r for r in ls) >= WINDOWS  # noqa: E731
                             for ls in net.miner_lines().values())
        done = wait_for(lambda: len(net.validator_lines()) >= WINDOWS and worked() or bool(net.dead()),
                        timeout=420, step=0.5)
        assert done and not net.dead(), {p.name: p.read_text()[-2000:] for p in net.logs.glob("*.log")}
        return net.validator_lines(), net.miner_lines()


def test_honest_miners_train_for_most_of_the_window(lines):
    validator, miners = lines
    for name, records in miners.items():
        worked = [r for r in records if "utilisation" in r][2:]  # the first windows include joining the run
        assert len(worked) >= WINDOWS - 5, f"{name} worked too few windows: {len(worked)}"
        mean = sum(r["utilisation"] for r in worked) / len(worked)
        assert mean >= FLOOR, f"{name}: utilisation {mean:.2f} ({[r['utilisation'] for r in worked]})"
        ahead = [r for r in worked if r.get("ahead_steps", 0) > 0]
        assert len(ahead) >= len(worked) // 2, f"{name} trained ahead in {len(ahead)} of {len(worked)} windows"


def test_miners_still_hold_the_validators_model(lines):
    validator, miners = lines
    reference = {line["window"]: line["model_hash"] for line in validator}
    for name, records in miners.items():
        compared = [r for r in records if r.get("window") in reference and "model_hash" in r]
        assert len(compared) >= WINDOWS - 5, f"{name} followed too few windows"
        for r in compared:
            assert r["model_hash"] == reference[r["window"]], f"{name} diverged at window {r['window']}"
