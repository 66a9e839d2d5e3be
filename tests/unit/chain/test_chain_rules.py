"""Pure chain rules against hand-computed values and independent oracles (numpy, hashlib, json)."""
from __future__ import annotations

import hashlib
import json
import math
from fractions import Fraction

import numpy as np
import pytest

from dso.chain import rules
from dso.chain.base import ChainError


# ------------------------------------------------------------ commitments
@pytest.mark.parametrize("bad, reason", [
    (None, "bad_commitment"), (b"bytes", "bad_commitment"), (42, "bad_commitment"), ("", "bad_commitment"),
    ("a\nb", "bad_commitment"), ("nul\x00", "bad_commitment"), ("tab\there", "bad_commitment"),
    ("caf\u00e9", "bad_commitment"), ("\ud800", "bad_commitment"), ("x" * 385, "too_large"),
])
def test_commitment_refusals_carry_a_reason_and_message(bad, reason):
    with pytest.raises(ChainError) as e:
        rules.check_commitment(bad, 384)
    assert e.value.reason == reason and str(e.value)


def test_commitment_accepts_printable_ascii_up_to_the_limit():
    data = "dso1|http://127.0.0.1:9090|us-east-1|b|K|S~ " + "z" * 300
    assert rules.check_commitment(data[:384], 384) == data[:384]


def test_commitment_fields_split_into_raw_fields_of_at_most_128_bytes():
    data = "".join(chr(33 + i % 90) for i in range(300))
    fields = rules.commitment_fields(data)
    assert [list(f) for f in fields] == [["Raw128"], ["Raw128"], ["Raw44"]]
    assert b"".join(next(iter(f.values())) for f in fields) == data.encode()
    assert rules.commitment_fields("abc") == [{"Raw3": b"abc"}]
    with pytest.raises(ChainError) as e:
        rules.commitment_fields("x" * 385)  # 3 fields x 128 bytes is all the real chain holds
    assert e.value.reason == "too_large"


# ---------------------------------------------------------------- weights
def test_normalise_weights_sums_to_one_and_keeps_proportions():
    out = rules.normalise_weights([4, 1, 9], [2.0, 6, np.float32(0.0)])
    assert out == pytest.approx({4: 0.25, 1: 0.75, 9: 0.0})
    assert math.fsum(out.values()) == pytest.approx(1.0)
    huge = rules.normalise_weights(np.array([0, 1]), np.array([1e308, 1e308]))  # no overflow to inf
    assert huge == {0: 0.5, 1: 0.5}


@pytest.mark.parametrize("uids, weights, needle", [
    ([0, 1], [1.0], "differ in length"),
    ([], [], "no weights"),
    ([0, 1], [float("nan"), 1.0], "not finite"),
    ([0, 1], [float("inf"), 1.0], "not finite"),
    ([0, 1], [-0.5, 1.0], "negative"),
    ([0, 1], [0.0, 0.0], "all weights are zero"),
    ([0, 0], [1.0, 1.0], "appears twice"),
    ([0, 1.5], [1.0, 1.0], "not an integer"),
    ([True, 1], [1.0, 1.0], "not an integer"),
    ([0, 1], ["1", 1.0], "not a number"),
    ([0, -1], [1.0, 1.0], "out of range"),
    ([0, 8], [1.0, 1.0], "out of range"),
    (5, [1.0], "sequences"),
])
def test_bad_weights_are_refused_with_a_message(uids, weights, needle):
    with pytest.raises(ChainError) as e:
        rules.normalise_weights(uids, weights, n_uids=8)
    assert e.value.reason == "bad_weights" and needle in str(e.value)


# ------------------------------------------------------- permits, eviction
def test_validator_permits_go_to_the_largest_eligible_stakes_ties_to_lower_uid():
    stakes = {0: 5.0, 1: 50.0, 2: 5.0, 3: 0.5, 4: 20.0, 5: 0.0}
    assert rules.validator_permits(stakes, max_validators=3, min_stake=1.0) == {1, 4, 0}
    assert rules.validator_permits(stakes, max_validators=10, min_stake=1.0) == {0, 1, 2, 4}
    assert rules.validator_permits(stakes, max_validators=10, min_stake=0.0) == {0, 1, 2, 3, 4}


def test_eviction_takes_lowest_incentive_then_oldest_then_lowest_uid_never_immune():
    # (uid, incentive, registered at)
    neurons = [(0, 0.5, 0), (1, 0.1, 50), (2, 0.1, 40), (3, 0.0, 95), (4, 0.1, 40)]
    assert rules.pick_eviction(neurons, block=100, immunity_blocks=10) == 2  # uid 3 is immune
    assert rules.pick_eviction(neurons, block=105, immunity_blocks=10) == 3
    assert rules.pick_eviction(neurons, block=30, immunity_blocks=10) == 0  # only uid 0 is old enough
    assert rules.pick_eviction(neurons, block=5, immunity_blocks=10) is None


# -------------------------------------------------------------- consensus
def test_stake_weighted_median_is_the_median_for_equal_stakes_and_odd_counts():
    rng = np.random.default_rng(0)
    for _ in range(50):
        values = rng.random(int(rng.integers(1, 8)) * 2 + 1)
        assert rules.stake_weighted_median(values, np.ones(len(values))) == np.median(values)


def test_stake_weighted_median_needs_a_strict_majority_of_stake():
    assert rules.stake_weighted_median([0.9, 0.1], [1, 1]) == 0.1  # half the stake is not a majority
    assert rules.stake_weighted_median([0.9, 0.1], [1.01, 1]) == 0.9
    assert rules.stake_weighted_median([0.3, 0.6, 0.0], [0.2, 0.35, 0.45]) == 0.3
    assert rules.stake_weighted_median([0.5], [0.0]) == 0.0


def test_yuma_consensus_hand_computed_example():
    # stakes 50/30/20 (normalised .5/.3/.2); three miners.
    W = [[0.6, 0.4, 0.0],
         [0.5, 0.0, 0.5],
         [0.2, 0.3, 0.5]]
    consensus, incentive = rules.yuma_consensus(W, [50, 30, 20])
    # column 0: support for >=0.6 is .5 (not > .5), for >=0.5 it is .8 -> 0.5
    # column 1: >=0.4 has .5, >=0.3 has .7 -> 0.3; column 2: >=0.5 has .3+.2 = .5 -> 0
    assert consensus.tolist() == [0.5, 0.3, 0.0]
    # clipped ranks: .5*.5+.3*.5+.2*.2 = .44 ; .5*.3+.2*.3 = .21 ; 0
    assert incentive == pytest.approx([float(Fraction(44, 65)), float(Fraction(21, 65)), 0.0], abs=1e-15)


def test_yuma_consensus_without_stake_or_validators_gives_nothing():
    assert rules.yuma_consensus(np.zeros((0, 3)), [])[1].tolist() == [0.0, 0.0, 0.0]
    assert rules.yuma_consensus([[1.0, 0.0]], [0.0])[1].tolist() == [0.0, 0.0]


def test_a_lone_outlier_validator_cannot_move_consensus():
    honest = [0.5, 0.5, 0.0]
    W = [honest, honest, [0.0, 0.0, 1.0]]  # third validator pushes uid 2 with a third of the stake
    _, incentive = rules.yuma_consensus(W, [1, 1, 1])
    assert incentive == pytest.approx([0.5, 0.5, 0.0])


# ----------------------------------------------------------------- ledger
def test_ledger_hash_matches_an_independent_sha256():
    record = {"window": 3, "model": "ab", "contributors": [1, 2], "score": 0.25}
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    assert rules.ledger_hash("0" * 64, record) == hashlib.sha256(b"0" * 64 + canonical).hexdigest()
    assert rules.canonical_json({"b": 1, "a": [1.5, "x"]}) == b'{"a":[1.5,"x"],"b":1}'
    with pytest.raises(ValueError):
        rules.canonical_json({"x": float("nan")})
