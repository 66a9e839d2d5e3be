"""Commit-reveal hashing, verdicts, duplicate detection and the ZIP-407 penalty mapping."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from dso.protocol.commit import (
    BAN_AFTER,
    NONCE_BYTES,
    Penalty,
    apply_penalty,
    commit_penalty,
    commitment_hash,
    content_digest,
    count_invalid,
    find_duplicates,
    is_commitment,
    judge_reveal,
    new_nonce,
    penalty_for,
    verify_reveal,
)
from dso.protocol.rejections import Reason

NONCE = bytes(range(32))


def test_hash_matches_an_independent_byte_layout():
    # oracle: the documented layout written out by hand
    payload = b"gradient bytes"
    blob = (len(b"dso/commit/v1").to_bytes(8, "big") + b"dso/commit/v1" + (17).to_bytes(8, "big")
            + (3).to_bytes(8, "big") + len(payload).to_bytes(8, "big") + payload + (32).to_bytes(8, "big") + NONCE)
    assert commitment_hash(17, 3, payload, NONCE) == hashlib.sha3_256(blob).hexdigest()
    assert is_commitment(commitment_hash(0, 0, b"", NONCE))


def test_every_field_changes_the_hash_and_fields_cannot_be_shifted():
    base = commitment_hash(5, 9, b"ab", NONCE)
    others = {commitment_hash(6, 9, b"ab", NONCE), commitment_hash(5, 8, b"ab", NONCE),
              commitment_hash(5, 9, b"ac", NONCE), commitment_hash(5, 9, b"ab", bytes(32)),
              commitment_hash(5, 9, b"ab", NONCE, domain=b"other")}
    assert base not in others and len(others) == 5
    # moving a byte from the payload into the nonce must not collide (length prefixes)
    assert commitment_hash(1, 1, b"ab", b"c") != commitment_hash(1, 1, b"a", b"bc")


def test_bad_integers_are_refused():
    for window, uid in ((-1, 0), (0, -1), (2 ** 64, 0), (True, 0), (1.5, 0)):
        with pytest.raises(ValueError):
            commitment_hash(window, uid, b"", NONCE)


def test_verify_reveal():
    nonce = new_nonce()
    assert len(nonce) == NONCE_BYTES and nonce != new_nonce()
    c = commitment_hash(12, 4, b"payload", nonce)
    assert verify_reveal(c, 12, 4, b"payload", nonce)
    assert not verify_reveal(c, 12, 4, b"payload!", nonce)
    assert not verify_reveal(c, 12, 5, b"payload", nonce)  # a copier revealing under its own uid
    assert not verify_reveal(c, 13, 4, b"payload", nonce)
    assert not verify_reveal(c.upper(), 12, 4, b"payload", nonce)
    assert not verify_reveal(c[:-1], 12, 4, b"payload", nonce)
    short = b"x" * 8
    assert not verify_reveal(commitment_hash(12, 4, b"payload", short), 12, 4, b"payload", short)
    assert not verify_reveal(c, -1, 4, b"payload", nonce)
    assert not verify_reveal(c, 12, 4, "payload", nonce)


def test_judge_reveal_verdicts():
    nonce = new_nonce()
    c = commitment_hash(7, 2, b"p", nonce)
    assert judge_reveal(c, True, b"p", nonce, 7, 2) is None
    assert judge_reveal(c, True, None, None, 7, 2).reason is Reason.NO_REVEAL
    assert judge_reveal(None, False, None, None, 7, 2).reason is Reason.MISSING
    assert judge_reveal(None, False, b"p", nonce, 7, 2).reason is Reason.NO_COMMIT
    assert judge_reveal(c, False, b"p", nonce, 7, 2).reason is Reason.NO_COMMIT  # committed too late
    assert judge_reveal(c, True, b"q", nonce, 7, 2).reason is Reason.REVEAL_MISMATCH
    assert judge_reveal("zz", True, b"p", nonce, 7, 2).reason is Reason.BAD_COMMITMENT


def test_duplicates_keep_the_earliest_commitment():
    a = {"x.idx": np.arange(4, dtype=np.uint8), "x.val": np.ones(3, np.float32)}
    b = {"x.idx": np.arange(4, dtype=np.uint8), "x.val": np.ones(3, np.float32)}
    c = {"x.idx": np.arange(4, dtype=np.uint8), "x.val": np.ones(3, np.float16)}  # same numbers, other dtype
    digests = {1: content_digest(a), 2: content_digest(b), 3: content_digest(c), 4: content_digest(dict(a))}
    assert digests[1] == digests[2] == digests[4] != digests[3]
    out = find_duplicates(digests, commit_times={1: 10.0, 2: 9.5, 4: 9.5})
    assert set(out) == {1, 4} and all(r.reason is Reason.DUPLICATE for r in out.values())
    assert "uid 2" in out[1].detail
    assert set(find_duplicates(digests)) == {2, 4}  # no times: the lowest uid keeps it


def test_penalty_table():
    phi = 0.75
    assert penalty_for(Reason.NO_COMMIT) == Penalty(phi)
    assert penalty_for(Reason.NO_REVEAL) == Penalty(phi * 0.95)
    assert penalty_for(Reason.REVEAL_MISMATCH) == Penalty(phi * 0.80, 7)
    assert penalty_for(Reason.MALFORMED) == Penalty(phi * 0.80, 7)  # a malformed update is an invalid one
    assert penalty_for(Reason.DUPLICATE) == Penalty(phi * 0.50, 30)
    assert penalty_for(Reason.TOO_LATE) == Penalty(phi)
    # third invalid submission: everything, and a ban
    assert penalty_for(Reason.REVEAL_MISMATCH, prior_offences=BAN_AFTER - 1) == Penalty(0.0, 0, True)
    assert penalty_for(Reason.DUPLICATE, prior_offences=5).banned
    assert not penalty_for(Reason.NO_REVEAL, prior_offences=5).banned  # not an invalid update
    assert commit_penalty("no_reveal", 0, fast_penalty=1.0) == pytest.approx(0.95)
    # ordering the ZIP-407 table implies
    order = [commit_penalty(r) for r in (Reason.NO_COMMIT, Reason.NO_REVEAL, Reason.REVEAL_MISMATCH,
                                         Reason.DUPLICATE)]
    assert order == sorted(order, reverse=True)
    assert count_invalid([Reason.NO_REVEAL, "duplicate", Reason.BAD_KEYS, Reason.TOO_LATE]) == 2
    with pytest.raises(ValueError):
        penalty_for(Reason.NO_REVEAL, prior_offences=-1)


def test_apply_penalty_never_rewards():
    assert apply_penalty(0.8, 0.5) == pytest.approx(0.4)
    assert apply_penalty(-0.4, 0.5) == -0.4
    assert apply_penalty(0.3, 0.0) == 0.0
