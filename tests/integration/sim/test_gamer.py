"""A miner that trains only when it expects evaluation: paid under the old round-robin schedule, not under the drawn
one.  It is given the most a miner could know (sim/foresight.py); in the windows it does not train it uploads zeros,
an empty update the validator rejects at once (scoring/history.py)."""
from __future__ import annotations

import pytest

from scoring.schedules import DRAWN, EvalSchedule, LeastRecentSchedule
from sim import behaviours
from sim.simulator import SimNet, behaviour_shares

ROLES = ["honest"] * 6 + ["gamer"]
GAMER = len(ROLES)


def _run(hp, sim_dataset, schedule: EvalSchedule, windows: int):
    hp.eval_peers, hp.learning_rate, hp.seed = 2, 5e-3, 3
    return SimNet(hp, sim_dataset(hp), ROLES, schedule=schedule).run(windows)


def test_under_round_robin_the_gamer_is_only_ever_evaluated_when_it_trained(sim_dataset, simnet_hparams):
    records = _run(simnet_hparams(), sim_dataset, LeastRecentSchedule(), 15)
    evaluated = [r.window for r in records if GAMER in r.evaluated]
    trained = [r.window for r in records if GAMER in r.trained]
    assert len(evaluated) >= 3 and evaluated == trained          # it foresaw every evaluation, and trained then only
    assert len(trained) <= len(records) / 3


def test_under_the_drawn_schedule_the_gamer_gets_no_weight(sim_dataset, simnet_hparams):
    records = _run(simnet_hparams(), sim_dataset, DRAWN, 30)
    guessed = [r.window for r in records if GAMER in r.trained]
    empty = [r.window for r in records if r.rejections.get(GAMER) == "empty"]
    assert len(guessed) >= 3 and empty == [r.window for r in records if GAMER not in r.trained]
    cumulative = sum(behaviour_shares(ROLES, r.weights)["gamer"] for r in records) / len(records)
    assert cumulative <= 0.01 and behaviour_shares(ROLES, records[-1].weights)["gamer"] <= 0.01
    assert sum(behaviour_shares(ROLES, records[-1].weights).values()) == pytest.approx(1.0)


def test_gamer_plans():
    assert behaviours.gamer_plan(0.5).train and not behaviours.gamer_plan(0.49).train
    assert behaviours.gamer_plan(0.0).apply_aggregate                      # it keeps following the network
    local = [behaviours.make("gamer").plan(t).train for t in range(2 * behaviours.GAMER_PERIOD)]
    assert local.count(True) == 2                                          # without foresight: one window in 5


def test_gamer_uploads_its_update_or_zeros():
    import torch

    from dso.codec.demo import DeMoCodec

    codec = DeMoCodec({"a": (32, 32)}, chunk=16, topk=8, value_bits=4)
    own = codec.compress({"a": torch.randn(32, 32)}, 0)
    gamer = behaviours.make("gamer")
    assert gamer.upload(behaviours.Inputs(codec, 0, own, torch.Generator())) is own
    zeros = gamer.upload(behaviours.Inputs(codec, 0, None, torch.Generator()))
    assert codec.decompress(zeros)["a"].abs().max() == 0
