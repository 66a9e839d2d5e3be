"""The validators' agreement figure: pairwise L1 of weight rows, over the windows every validator weighted."""
from __future__ import annotations

import pytest

from sim import agreement
from sim.report import build, markdown


def line(window, weights, leading=False):
    return {"window": window, "weights": {str(u): w for u, w in weights.items()}, "leading": leading,
            "val_loss": 5.0}


def test_l1_and_mean_pairwise_by_hand():
    assert agreement.l1({1: 0.5, 2: 0.5}, {1: 0.25, 3: 0.75}) == pytest.approx(0.25 + 0.5 + 0.75)
    rows = [{1: 1.0}, {1: 0.5, 2: 0.5}, {2: 1.0}]
    assert agreement.mean_pairwise_l1(rows) == pytest.approx((1.0 + 2.0 + 1.0) / 3)
    assert agreement.mean_pairwise_l1(rows[:1]) == 0.0


def test_agreement_skips_cold_windows_and_windows_not_all_scored():
    lines = {"v0": [line(0, {1: 0.0}, True), line(1, {1: 0.6, 2: 0.4}, True), line(2, {1: 0.5, 2: 0.5}, True),
                    line(3, {1: 1.0}, True)],
             "v1": [line(0, {1: 0.0}), line(1, {1: 0.4, 2: 0.6}), line(2, {1: 0.5, 2: 0.5}, True)]}
    got = agreement.weight_agreement(lines, last=10)
    assert [p["window"] for p in got["per_window"]] == [1, 2]            # 0 is all zero, 3 only v0 scored
    assert got["mean_l1_last"] == pytest.approx((0.4 + 0.0) / 2)
    assert got["met"] is False and got["last_windows"] == 2
    assert got["leaders"] == {"0": ["v0"], "1": ["v0"], "2": ["v0", "v1"], "3": ["v0"]}
    assert agreement.weight_agreement(lines, last=1)["mean_l1_last"] == 0.0


def test_report_has_a_validators_section_only_with_several_validators():
    lines = [line(1, {1: 0.5, 2: 0.5}, True)]
    peers = {1: ("miner0", "honest"), 2: ("miner1", "honest")}
    single = build(lines, peers, None, {"validator0": lines})
    assert "validators" not in single and "## Validators" not in markdown(single)
    several = build(lines, peers, None, {"validator0": lines, "validator1": [line(1, {1: 0.45, 2: 0.55})]})
    assert several["validators"]["mean_l1_last"] == pytest.approx(0.1)
    text = markdown(several)
    assert "## Validators" in text and "**0.1000**" in text and "window 1: validator0" in text


def test_miner_sync_compares_each_applied_bundle_with_its_windows_leader():
    v0 = [dict(line(5, {}, True), model_hash="a5"), dict(line(6, {}, True), model_hash="a6")]
    v1 = [dict(line(5, {}), model_hash="a5"), dict(line(6, {}), model_hash="b6"),   # v1 went its own way in 6
          dict(line(7, {}, True), model_hash="b7")]                                 # and leads from 7
    miners = {"m0": [{"window": 5, "aggregated": "applied the leader's bundle", "model_hash": "a5"},
                     {"window": 6, "aggregated": "applied the leader's bundle", "model_hash": "b6"},  # forked
                     {"window": 7, "aggregated": "no bundle of window 7 yet", "model_hash": "b6"},
                     {"window": 8, "aggregated": "applied the leader's bundle", "model_hash": "x8"}],  # unled
              "m1": [{"window": 7, "aggregated": "applied the leader's bundle", "model_hash": "b7"}]}
    got = agreement.miner_sync({"v0": v0, "v1": v1}, miners)
    assert got == {"applied": 3, "in_sync": 2, "forked": [["m0", 6]]}


def test_report_counts_only_honest_miners_in_sync():
    v0 = [dict(line(1, {1: 0.5, 2: 0.5}, True), model_hash="h1")]
    v1 = [dict(line(1, {1: 0.5, 2: 0.5}), model_hash="h1")]
    peers = {1: ("miner0", "honest"), 2: ("miner1", "desync")}
    applied = {"window": 1, "aggregated": "applied the leader's bundle"}
    miners = {1: [dict(applied, model_hash="h1")], 2: [dict(applied, model_hash="other")]}
    report = build(v0, peers, None, {"validator0": v0, "validator1": v1}, miners)
    assert report["validators"]["miner_sync"] == {"applied": 1, "in_sync": 1, "forked": []}
    assert "**1 of 1** (out of sync: none)" in markdown(report)
