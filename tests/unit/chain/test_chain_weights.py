"""Weight posts that respect the chain: the pure planner, its clip against the SDK's, and post_weights."""
from __future__ import annotations

import random

import bittensor as bt
import pytest
from bittensor.intents.weights import clip_to_max_weight

from chain_helpers import hk, wallets
from dso.chain import rules
from dso.chain.base import WeightRules
from dso.chain.bittensor_chain import BittensorChain
from dso.chain.wallets import dev_wallet
from dso.chain.weights import PAD_FRACTION, WeightPlan, WeightRefusal, WeightsRefused, next_post_block, plan_weights
from fake_substrate import FakeSubstrate

UIDS = list(range(10))


def plan(scores, *, own=0, last=0, now=1000, version=5, pad=True, **rule):
    return plan_weights(scores, WeightRules(**rule), version_key=version, registered=UIDS, own_uid=own,
                        last_update=last, now=now, pad=pad)


def test_clip_is_exact_water_filling_and_agrees_with_the_sdk():
    rng = random.Random(7)
    for _ in range(500):
        n = rng.randint(2, 40)
        w = [rng.uniform(0.05, 1.0) ** rng.choice([1, 3]) for _ in range(n)]
        limit = rng.uniform(1.3 / n, 1.0)  # near n * limit = 1 the SDK's epsilon is amplified
        mine = rules.clip_max_weight(dict(enumerate(w)), limit)
        assert sum(mine.values()) == pytest.approx(1.0) and max(mine.values()) <= limit * (1 + 1e-12)
        order = sorted(range(n), key=lambda i: w[i])
        assert [mine[i] for i in order] == sorted(mine.values())  # clipping keeps the order
        # the SDK subtracts a 1e-7 epsilon in its cutoff; on weights far above it the two agree
        assert [mine[i] for i in range(n)] == pytest.approx(clip_to_max_weight(w, limit), abs=1e-5)
    assert rules.clip_max_weight({1: 3.0, 2: 1.0}, 0.4) == {1: 0.5, 2: 0.5}  # n * limit <= 1: equal shares


def test_version_and_rate_limit_are_refused_with_the_next_block():
    got = plan({1: 1.0}, version=4, version_key=5)
    assert isinstance(got, WeightRefusal) and got.reason == "outdated_version"
    got = plan({1: 1.0}, last=950, now=1000, rate_limit_blocks=100)
    assert isinstance(got, WeightRefusal) and got.reason == "rate_limited" and got.next_allowed_block == 1050
    assert isinstance(plan({1: 1.0}, last=900, now=1000, rate_limit_blocks=100), WeightPlan)
    assert next_post_block(0, 100) == 0  # never posted: now


def test_too_few_weights_are_padded_minimally_or_refused():
    got = plan({3: 2.0, 7: 1.0}, min_allowed_weights=4)
    assert isinstance(got, WeightPlan) and got.padded == [1, 2]  # lowest other uids, never our own (0)
    row = dict(zip(got.uids, got.weights, strict=True))
    assert row[1] == row[2] == pytest.approx(row[3] * PAD_FRACTION) and sum(got.weights) == pytest.approx(1.0)
    assert round(row[1] / row[3] * 65535) == 2  # survives the chain's max-upscaled u16 quantisation
    refused = plan({3: 2.0}, min_allowed_weights=4, pad=False)
    assert isinstance(refused, WeightRefusal) and refused.reason == "too_few_weights"
    short = plan_weights({3: 1.0}, WeightRules(min_allowed_weights=5), version_key=0, registered=[0, 3, 4],
                         own_uid=0, last_update=0, now=1)  # needs 3 (capped), only uids 3 and 4 to weight
    assert isinstance(short, WeightRefusal) and short.reason == "too_few_weights"
    assert isinstance(plan({0: 1.0}, min_allowed_weights=4), WeightPlan)  # a lone self-weight is exempt


def test_bad_entries_are_dropped_and_the_clip_is_reported():
    got = plan({1: float("nan"), 2: -1.0, 3: 0.0, 42: 5.0, 4: 3.0, 5: 1.0, 6: 1.0}, max_weight_limit=0.5)
    assert isinstance(got, WeightPlan) and got.uids == [4, 5, 6] and got.clipped
    assert got.weights == pytest.approx([0.5, 0.25, 0.25])
    assert plan({1: 0.0}).reason == "bad_weights"
    assert plan({1: 1.0, 2: 1.0}, commit_reveal=True).reveals_later


def test_post_weights_on_the_local_chain(make_chain, clock):
    chain = make_chain(weights_rate_limit=10, min_allowed_weights=3, weights_version=2)
    v, *miners = wallets("post", 5)
    for w in (v, *miners):
        chain.register(w)
    chain.add_stake(hk(v), 5.0)
    chain.weights_version = 2
    posted = chain.post_weights(v, {1: 1.0})
    assert posted.padded == [2, 3] and chain.weights()[0][1] > 0.99
    clock.advance_blocks(3)
    with pytest.raises(WeightsRefused) as e:
        chain.post_weights(v, {1: 1.0, 2: 1.0, 3: 1.0})
    assert e.value.reason == "rate_limited" and e.value.refusal.next_allowed_block == 1010
    clock.advance_blocks(7)
    chain.post_weights(v, {1: 1.0, 2: 1.0, 3: 1.0})
    assert chain.weights()[0] == pytest.approx({1: 1 / 3, 2: 1 / 3, 3: 1 / 3})


def test_post_weights_on_bittensor_uses_the_subnet_rules(monkeypatch, tmp_path):
    monkeypatch.setenv("BTCLI_TOKEN_SYMBOLS_CACHE", str(tmp_path / "symbols.json"))
    fake = FakeSubstrate(netuid=5, head=2000, block_time=12.0)
    v, a, b = dev_wallet("//pw0"), dev_wallet("//pw1"), dev_wallet("//pw2")
    fake.add_neuron(hk(v), stake_tao=5.0)
    fake.add_neuron(hk(a))
    fake.add_neuron(hk(b))
    fake.hyper = {"MinAllowedWeights": 2, "WeightsVersionKey": 10, "MaxWeightsLimit": 65535}
    chain = BittensorChain("test", 5, client=bt.SyncClient("test", substrate=fake), weights_version=10)
    got = chain.post_weights(v, {1: 1.0})
    call = fake.submitted[-1][0]
    assert got.padded == [2] and call.params["dests"] == [1, 2] and call.params["weights"][1] == 2
    assert call.params["version_key"] == 10
    fake.hyper["WeightsVersionKey"] = 11  # the owner raised the version: refused before anything is sent
    sent = len(fake.submitted)
    with pytest.raises(WeightsRefused) as e:
        chain.post_weights(v, {1: 1.0, 2: 1.0})
    assert e.value.reason == "outdated_version" and len(fake.submitted) == sent
