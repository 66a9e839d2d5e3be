"""A noise miner whose random update scores as well as the window's median once: the mean of its last two help
ratios paid it, the mean of its record (a no-work draw counted against it) does not.  The adversary zoo's own
network (tests/e2e/test_adversaries.py) in the simulator, at the seed where that happened (of 50 tried: 3 seeds
paid the noise under the mean of two, none under the default; docs/scoring.md, "A noise update as good as the
median")."""
from __future__ import annotations

import pytest

from dso.data import Dataset
from sim.simulator import SimNet

ROLES = ["honest"] * 3 + ["diligent", "freerider", "noise", "copier", "malformed"]
NOISE = ROLES.index("noise") + 1
SEED, WINDOWS = 18, 13


def _noise_weights(hp, stdlib_corpus, cache) -> list[float]:
    hp.eval_peers, hp.seed = 5, SEED
    ds = Dataset.from_config(str(stdlib_corpus), str(cache), 32, hp.seed, 0.02)
    return [r.weights.get(NOISE, 0.0) for r in SimNet(hp, ds, ROLES, inner_steps=1).run(WINDOWS)]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def test_the_mean_of_two_paid_the_noise_miner_here(stdlib_corpus, cache, network_hparams):
    hp = network_hparams()
    hp.help_rule = "mean_of_two"
    assert max(_noise_weights(hp, stdlib_corpus, cache)) > 0.01   # the case below is a real one


def test_the_default_gate_pays_the_noise_miner_nothing(stdlib_corpus, cache, network_hparams):
    hp = network_hparams()
    assert hp.help_rule == "mean_of_record"
    assert _noise_weights(hp, stdlib_corpus, cache) == [0.0] * WINDOWS
