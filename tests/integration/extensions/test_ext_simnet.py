"""The extensions in the in-process Gauntlet (neurons/simnet.py, tiny model): commit-reveal leaves copiers with
nothing, the DP accountant stops miners exactly when the budget says, and robust aggregation and the sketch
codec train end to end."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dso.config.schema import HParams, ModelConfig
from sim.simulator import SimNet, behaviour_shares

WINDOWS = 12


@pytest.fixture(scope="module")
def dataset(sim_dataset):
    return sim_dataset(tiny())


def tiny(**changes) -> HParams:
    hp = HParams(model=ModelConfig(d_model=32, n_layers=1, n_heads=2, ffn_hidden=64, seq_len=32))
    hp.batch_size, hp.assigned_sequences, hp.micro_batch, hp.chunk, hp.topk = 8, 16, 8, 16, 8
    hp.eval_sequences, hp.eval_peers, hp.learning_rate, hp.warmup_windows = 8, 8, 5e-3, 0
    hp.inner.steps_max = 2  # the assignment holds steps_max × batch_size
    for key, value in changes.items():
        setattr(hp, key, value)
    return hp


def uid_of(roles: list[str], role: str) -> int:
    return roles.index(role) + 1


# ---------------------------------------------------------------- commit-reveal
CR_ROLES = ["honest", "honest", "honest", "diligent", "copier", "alie", "late", "sybil", "sybil"]


@pytest.fixture(scope="module")
def commit_reveal_run(dataset):
    return SimNet(tiny(commit_reveal=True), dataset, CR_ROLES).run(WINDOWS)


def test_commit_reveal_leaves_copiers_nothing(commit_reveal_run):
    records = commit_reveal_run
    for role, reason in (("copier", "reveal_mismatch"), ("alie", "reveal_mismatch"), ("late", "no_commit")):
        assert all(r.rejections[uid_of(CR_ROLES, role)] == reason for r in records), role
    final = behaviour_shares(CR_ROLES, records[-1].weights)
    assert final["copier"] == 0.0 and final["alie"] == 0.0 and final["late"] == 0.0, final
    assert final["honest"] + final["diligent"] + final["sybil"] == pytest.approx(1.0)
    copier = uid_of(CR_ROLES, "copier")
    assert all(copier not in r.aggregated for r in records[2:])  # out of the list once scored
    assert records[-1].mu[copier] <= 0.0


def test_commit_reveal_sybils_lose_the_tie_and_get_banned(commit_reveal_run):
    sybils = [i + 1 for i, role in enumerate(CR_ROLES) if role == "sybil"]
    duplicates = [sum(r.rejections.get(u) == "duplicate" for r in commit_reveal_run) for u in sybils]
    assert sum(duplicates) == WINDOWS  # one of the two loses every window (committed in the same second)


def test_commit_reveal_run_trains(commit_reveal_run):
    assert commit_reveal_run[-1].val_loss < commit_reveal_run[0].val_loss - 0.1


# ------------------------------------------------------------------------ DP
def epsilon_after(rounds: int, z: float, delta: float, orders=range(2, 128)) -> float:
    """Independent evaluation: RDP of the Gaussian mechanism with sensitivity 2C (α·2²/2z² per round) converted
    by Balle et al. 2020."""
    a = np.array(list(orders), dtype=np.float64)
    eps = rounds * a * 4 / (2 * z * z) + np.log1p(-1 / a) - (math.log(delta) + np.log(a)) / (a - 1)
    return float(max(eps.min(), 0.0))


def test_dp_accountant_stops_every_miner_when_its_budget_would_be_exceeded(dataset):
    z, delta, allowed = 2.0, 1e-6, 3
    budget = (epsilon_after(allowed, z, delta) + epsilon_after(allowed + 1, z, delta)) / 2
    hp = tiny()
    hp.dp.enabled, hp.dp.noise_multiplier, hp.dp.delta, hp.dp.epsilon_budget = True, z, delta, budget
    hp.dp.target_epsilon = 0.0  # z and the budget as given
    roles = ["honest", "honest", "diligent", "freerider"]
    net = SimNet(hp, dataset, roles)
    records = net.run(6)
    trainers = [1, 2, 3]
    for r in records[:allowed]:
        assert not any(u in r.rejections for u in trainers), r.rejections
    for r in records[allowed:]:
        assert all(r.rejections.get(u) == "missing" for u in trainers), r.rejections
        assert 4 not in r.rejections or r.rejections[4] != "missing"  # the freerider trains nothing: no budget
    for peer in net.peers[:3]:
        assert peer.accountant.rounds == allowed
        assert peer.accountant.epsilon()[0] == pytest.approx(epsilon_after(allowed, z, delta), rel=1e-9)
        assert peer.accountant.epsilon()[0] <= budget < epsilon_after(allowed + 1, z, delta)


# ------------------------------------------------- robust aggregation, sketch codec
@pytest.mark.parametrize("changes", [dict(aggregation="krum", krum_f=1), dict(aggregation="median"),
                                     dict(codec="sketch", value_bits=8)],  # at its default sketch_dim
                         ids=["krum", "median", "sketch"])
def test_extension_trains_end_to_end(dataset, changes):
    roles = ["honest", "honest", "honest", "honest", "diligent", "signflip"]
    records = SimNet(tiny(**changes), dataset, roles).run(WINDOWS)
    assert records[-1].val_loss < records[0].val_loss - 0.1, [round(r.val_loss, 3) for r in records]
    final = behaviour_shares(roles, records[-1].weights)
    assert final["signflip"] == 0.0, final
