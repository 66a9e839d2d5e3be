"""Protocol validators mark themselves with a role field in their commitment; the parser stays strict
and reads every older (six-field) commitment as a miner's."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from dso.chain.roles import VALIDATOR, pick_leader, role_of, split_role, with_role
from dso.protocol.rejections import Rejection
from storage.commitment import BucketInfo, format_commitment, parse_commitment

INFO = BucketInfo("https://acc.r2.cloudflarestorage.com", "auto", "dso-val", "KEYID", "s3cr3t/+=")


def test_role_round_trips_and_old_commitments_are_miners():
    plain = format_commitment(INFO)
    tagged = format_commitment(BucketInfo(*[getattr(INFO, f) for f in
                                            ("endpoint", "region", "bucket", "access_key_id",
                                             "secret_access_key")], role=VALIDATOR))
    assert tagged == plain + "|validator" == with_role(plain, VALIDATOR) == with_role(tagged, VALIDATOR)
    assert parse_commitment(plain) == INFO and parse_commitment(plain).role == ""
    assert parse_commitment(tagged).role == VALIDATOR and parse_commitment(tagged).bucket == "dso-val"
    assert role_of(plain) is None and role_of(tagged) == VALIDATOR and role_of(None) is None
    assert split_role(tagged) == (plain, VALIDATOR)


@pytest.mark.parametrize("suffix", ["|miner", "|Validator", "|validator|validator", "|", "|v"])
def test_unknown_or_extra_fields_are_rejected(suffix):
    got = parse_commitment(format_commitment(INFO) + suffix)
    assert isinstance(got, Rejection) and got.reason.value == "bad_commitment"
    assert role_of(format_commitment(INFO) + suffix) is None


def test_with_role_refuses_what_is_not_a_commitment():
    with pytest.raises(ValueError):
        with_role(format_commitment(INFO), "miner")
    with pytest.raises(ValueError):
        with_role("dso1|a|b", VALIDATOR)


@dataclass
class V:
    uid: int
    stake: float
    last_update: int


def test_leader_is_the_largest_stake_and_an_idle_one_is_skipped():
    vs = [V(3, 10.0, 990), V(1, 50.0, 900), V(2, 50.0, 995)]
    assert pick_leader(vs).uid == 1  # ties: lower uid
    assert pick_leader(vs, now=1000, max_idle_blocks=50).uid == 2  # uid 1 posted 100 blocks ago
    assert pick_leader(vs, now=1000, max_idle_blocks=4) is None and pick_leader([]) is None
