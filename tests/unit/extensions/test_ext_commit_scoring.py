"""ZIP-407 penalties in scoring (scoring/window.py with hparams.commit_reveal): the multipliers of the table,
escalation to a ban on the third invalid update, sign safety, one penalty per window, and the plain Gauntlet
φ when commit-reveal is off.  Numbers are hand-computed from the table in docs/extensions.md §2."""
from __future__ import annotations

import hashlib

import pytest

from dso.codec.demo import DeMoCodec
from dso.nn.model import build_model, parameter_shapes
from dso.protocol.rejections import Reason, Rejection
from scoring import ValidatorState, score_window
from scoring.pay import pay
from scoring.window import Scorer, WindowEvidence, is_banned, penalty_multiplier

SECRET = "7a" * 16
PHI = 0.75


@pytest.fixture
def setup(tiny_hparams):
    hp = tiny_hparams
    hp.fast_peers, hp.topg, hp.fast_penalty = 16, 4, PHI
    model = build_model(hp.model, hp.seed)
    return hp, model, DeMoCodec.from_hparams(parameter_shapes(model), hp)


def score(setup, state, window, rejections, active):
    """One window in which nobody uploads anything usable: only penalties move μ (no evaluation)."""
    hp, model, codec = setup
    randomness = hashlib.sha256(f"w{window}".encode()).digest()
    evidence = WindowEvidence(window, {}, rejections, active, randomness,
                              hashlib.sha256(f"eval{window}".encode()).digest())
    return score_window(state, Scorer(model, codec, None, hp), evidence)


OFFENCES = {1: Reason.NO_COMMIT, 2: Reason.NO_REVEAL, 3: Reason.REVEAL_MISMATCH, 4: Reason.DUPLICATE,
            5: Reason.MALFORMED, 6: Reason.TOO_LATE, 7: Reason.OUT_OF_SYNC}
MISSING_UID = 8  # no payload and no rejection: the fast check's own "missing"


@pytest.mark.parametrize("commit_reveal", [True, False])
def test_one_window_of_offences_costs_what_the_table_says(setup, commit_reveal):
    hp = setup[0]
    hp.commit_reveal = commit_reveal
    state = ValidatorState.new(secret=SECRET)
    for uid in range(1, 9):
        state.peer(uid).mu = 0.4
    state.weights = {uid: 1 / 8 for uid in range(1, 9)}  # everyone was paid last window: nothing carries over
    report = score(setup, state, 0, {u: Rejection(r, "test") for u, r in OFFENCES.items()}, range(1, 9))
    if commit_reveal:  # φ·(1 − slash): 0.75, 0.75·0.95, 0.75·0.8, 0.75·0.5; format = invalid 0.75·0.8; others φ
        want = {1: 0.3, 2: 0.285, 3: 0.24, 4: 0.15, 5: 0.24, 6: 0.3, 7: 0.3, 8: 0.3}
    else:
        want = {uid: 0.3 for uid in range(1, 9)}
    for uid, mu in want.items():
        assert state.peers[uid].mu == pytest.approx(mu, abs=1e-12), uid
        assert report.mu[uid] == state.peers[uid].mu
    invalid = {uid: state.peers[uid].offences.get("invalid", 0) for uid in range(1, 9)}
    counted = {3: 1, 4: 1, 5: 1} if commit_reveal else {}
    assert invalid == {uid: counted.get(uid, 0) for uid in range(1, 9)}
    assert state.peers[3].offences["commit"] == 1 and state.peers[5].offences["format"] == 1
    assert sorted(report.rejections) == list(range(1, 9))  # each penalised exactly once
    # the pay: nobody is paid in a window in which it failed a check, whatever its μ and its last posted weight
    # (the smoothing keeps no share for it; scoring/pay.py)
    assert all(w == 0.0 for w in report.weights.values()) and not report.top_g
    assert [state.peers[uid].copies for uid in range(1, 9)] == [0, 0, 0, 1, 0, 0, 0, 0]


def test_the_third_invalid_update_bans_until_the_hotkey_changes(setup):
    hp = setup[0]
    hp.commit_reveal = True
    state = ValidatorState.new(secret=SECRET)
    active = {1: "hk-cheat", 2: "hk-honest", 3: "hk-shy"}
    for uid in active:
        state.peer(uid).mu = 0.4
    mus = []
    for window, reason in enumerate((Reason.REVEAL_MISMATCH, Reason.DUPLICATE, Reason.BAD_SHAPE)):
        shy = Rejection(Reason.NO_REVEAL)  # never revealing is not an invalid update: no escalation
        score(setup, state, window, {1: Rejection(reason), 3: shy}, active)
        mus.append(state.peers[1].mu)
    assert mus == pytest.approx([0.24, 0.24 * 0.375, 0.0])  # mismatch 0.6, copy 0.375, third invalid: ban (× 0)
    assert state.peers[1].offences["invalid"] == 3
    assert state.peers[3].mu == pytest.approx(0.4 * 0.7125 ** 3) and "invalid" not in state.peers[3].offences

    # the banned uid earns again by proof of computation and rating (set by hand): still no weight.  The pay rule
    # on the stored state (scoring/pay.py), nobody failing a check: the two others share the weight, uid 1 gets none
    for uid in active:
        state.peers[uid].mu, state.peers[uid].rating_mu, state.peers[uid].rating_sigma = 0.5, 30.0, 1.0
        peer = state.peers[uid]  # a record of evaluations: the proof of computation and the help gate pass
        peer.eval_count, peer.poc_record, peer.work, peer.help_ratios, peer.passes = 10, [3.0, 3.0], [16, 16], \
            [1.0, 1.0], 10
    banned = {uid for uid in active if is_banned(state.peers[uid], hp)}
    assert banned == {1}
    result = pay({uid: state.peers[uid] for uid in active}, hp, {}, 3, banned)
    scores, weights = result.scores, result.weights
    assert scores[2] > 0 and weights[2] > 0.4 and weights[3] > 0
    assert weights[1] == 0.0 and scores[1] <= 0
    # a window in which nobody uploads: a missing upload fails the fast check, so nobody is paid in it
    # and nobody enters the list — the banned uid least of all
    report = score(setup, state, 3, {}, active)
    assert report.weights == {1: 0.0, 2: 0.0, 3: 0.0} and report.scores[1] <= 0 and not report.top_g

    # the uid changes hands: a new hotkey starts clean
    report = score(setup, state, 4, {}, {**active, 1: "hk-new-owner"})
    assert state.peers[1].offences == {"missing": 1}
    assert 1 not in report.weights or report.weights[1] == 0.0  # fresh peer: μ = 0, not banned any more
    assert "invalid" not in state.peers[1].offences


def test_penalties_never_raise_mu(setup):
    hp = setup[0]
    hp.commit_reveal = True
    state = ValidatorState.new(secret=SECRET)
    state.peer(1).mu, state.peer(2).mu, state.peer(3).mu = -0.2, -0.2, 0.0
    state.peers[2].offences = {"invalid": 2}  # the next invalid update is the third
    score(setup, state, 0, {1: Rejection(Reason.REVEAL_MISMATCH), 2: Rejection(Reason.DUPLICATE),
                            3: Rejection(Reason.REVEAL_MISMATCH)}, [1, 2, 3])
    assert state.peers[1].mu == pytest.approx(-0.2 - 0.4 * 0.2)  # μ − (1 − 0.6)·|μ|
    assert state.peers[2].mu == pytest.approx(-0.4)               # banned: μ − |μ|
    assert state.peers[3].mu == 0.0                                # a fresh peer has nothing to lose


def test_penalty_multiplier_is_the_gauntlet_phi_when_commit_reveal_is_off(setup):
    hp = setup[0]
    state = ValidatorState.new(secret=SECRET)
    peer = state.peer(1)
    peer.offences = {"invalid": 5}
    hp.commit_reveal = False
    assert penalty_multiplier(Rejection(Reason.DUPLICATE), peer, hp) == PHI
    hp.commit_reveal = True
    assert penalty_multiplier(Rejection(Reason.DUPLICATE), peer, hp) == 0.0
    assert penalty_multiplier(Rejection(Reason.NO_REVEAL), peer, hp) == pytest.approx(PHI * 0.95)
    assert penalty_multiplier(Rejection(Reason.MISSING), peer, hp) == PHI
