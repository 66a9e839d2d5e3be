"""score_window end to end on a tiny model: in-place evaluation, fast checks, penalties, exploit, restart."""
from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch

from dso.nn.model import model_hash
from dso.protocol.rejections import Reason, Rejection
from dso.training.train import learning_rate, sequence_losses
from mininet import MiniNet, chain_randomness, eval_seed
from scoring import ValidatorState, WindowAlreadyScored, load, plan_fast_set, score_window
from scoring.evaluation import ParameterSnapshot, evaluate_peer, random_losses, update_signs
from scoring.formulas import poc_pays, poc_update, poc_verdict
from scoring.help_gate import help_gate
from scoring.schedules import DRAWN, EvalSchedule, LeastRecentSchedule
from scoring.window import Scorer, WindowEvidence

SECRET = "5e" * 16


def score(net: MiniNet, state: ValidatorState, window: int, payloads, rejections=None, active=None, dataset=None,
          schedule: EvalSchedule = DRAWN):
    evidence = WindowEvidence(window, payloads, rejections or {}, sorted(net.behaviours) if active is None else active,
                              chain_randomness(window), eval_seed(window))
    return score_window(state, Scorer(net.model, net.codec, net.dataset if dataset is None else dataset, net.hp,
                                      schedule=schedule), evidence)


def run(net: MiniNet, state: ValidatorState, window: int, payloads=None, rejections=None, active=None,
        schedule: EvalSchedule = DRAWN):
    payloads = net.payloads(window) if payloads is None else payloads
    report = score(net, state, window, payloads, rejections, active, schedule=schedule)
    net.apply_aggregate(window, state.top_g, payloads)
    return report


# --------------------------------------------------------------- in-place evaluation
def test_in_place_evaluation_matches_a_model_copy_and_restores_theta_bit_exactly(hp, dataset):
    net = MiniNet(hp, dataset, {3: "honest", 4: "honest"})
    payloads = net.payloads(0)
    size = hp.eval_scale * learning_rate(hp, 0)
    step = {n: size * s for n, s in update_signs(net.codec.decompress, payloads[3].update, net.shapes).items()}
    control = {n: size * s for n, s in update_signs(net.codec.decompress, payloads[4].update, net.shapes).items()}
    assigned, rand = dataset.assigned(3, 0, 4), dataset.validation(4)
    before = model_hash(net.model)

    def at(displacement):
        oracle = copy.deepcopy(net.model)
        with torch.no_grad():
            for name, p in oracle.named_parameters():
                p.sub_(displacement[name])
        return oracle

    snapshot = ParameterSnapshot(net.model)
    random = random_losses(net.model, snapshot, control, rand, 4)
    got = evaluate_peer(net.model, snapshot, step, control, assigned, random, 4)
    expected = [sequence_losses(at(control), assigned, 4), sequence_losses(at(step), assigned, 4),
                sequence_losses(net.model, rand, 4), sequence_losses(at(control), rand, 4),
                sequence_losses(at(step), rand, 4)]
    for name, want in zip(("control_assigned", "stepped_assigned", "base_rand", "control_rand", "stepped_rand"),
                          expected, strict=True):
        assert getattr(got, name).tolist() == pytest.approx(want.tolist()), name
    assert got.delta_rand == pytest.approx(float(expected[2].mean() - expected[4].mean()))
    assert model_hash(net.model) == before
    # The naive undo θ − a + a is not exact, which is why a snapshot is restored instead.
    w = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 0.02
    assert not torch.equal(w - 0.01 + 0.01, w)


def test_model_is_restored_even_when_a_forward_pass_fails(hp, dataset):
    net = MiniNet(hp, dataset, {0: "honest"})
    step = {n: 0.01 * s for n, s in update_signs(net.codec.decompress, net.payloads(0)[0].update, net.shapes).items()}
    before = model_hash(net.model)
    bad_rand = torch.full((2, hp.model.seq_len + 1), 999)          # token ids outside the vocabulary
    snapshot = ParameterSnapshot(net.model)
    random = random_losses(net.model, snapshot, None, dataset.validation(2), 4)
    with pytest.raises(IndexError):
        evaluate_peer(net.model, snapshot, step, None, dataset.assigned(0, 0, 4),
                      dataclasses.replace(random, batch=bad_rand), 4)
    assert model_hash(net.model) == before


def test_forward_passes_per_window_are_two_plus_three_per_evaluated_peer(hp, dataset):
    hp.eval_peers = 3
    net = MiniNet(hp, dataset, {u: "honest" for u in range(5)})
    payloads = net.payloads(0)
    calls = []
    original = net.model.sequence_losses
    net.model.sequence_losses = lambda batch: calls.append(batch.shape[0]) or original(batch)
    zero = {n: torch.zeros(s) for n, s in net.shapes.items()}
    evidence = WindowEvidence(0, payloads, {}, range(5), chain_randomness(0), eval_seed(0), control=zero)
    report = score_window(ValidatorState.new(secret=SECRET), Scorer(net.model, net.codec, dataset, hp), evidence)
    assert len(report.evaluated) == 3
    # the random sequences at θ_t and at the control once; per peer its trained sample at θ' and at the control,
    # and the random ones at θ' (each one micro-batch here)
    assert len(calls) == 2 + 3 * 3 and set(calls) == {hp.eval_sequences}


# ---------------------------------------------------------------- fast checks
def test_fast_failures_are_penalised_once_and_counted_by_category(hp, dataset):
    hp.eval_peers, hp.fast_peers = 8, 8
    net = MiniNet(hp, dataset, {0: "honest", 1: "honest", 2: "honest", 3: "stale", 4: "honest", 5: "honest",
                                6: "honest", 7: "honest"})
    payloads = net.payloads(0)
    del payloads[1]                                                            # missing
    rejections = {2: Rejection(Reason.TOO_LATE, "5 s after close")}            # timing (payload also present)
    payloads[4] = dataclasses.replace(payloads[4], sync_values=torch.zeros(3))  # sync vector of the wrong shape
    payloads[5] = dataclasses.replace(payloads[5], update={"embed.weight": "garbage"})  # does not decode
    payloads[6] = dataclasses.replace(payloads[6], update=dict(list(payloads[6].update.items())[1:]))  # one missing
    payloads[7] = dataclasses.replace(payloads[7], sync_values=torch.full((hp.sync_samples,), float("nan")))
    state = ValidatorState.new(secret=SECRET)
    for uid in range(8):
        state.peer(uid).mu = 0.4
    state.peer(3).mu = -0.2                                                    # penalty must push it down
    before = model_hash(net.model)
    report = score(net, state, 0, payloads, rejections, active=range(8), dataset=dataset)
    assert model_hash(net.model) == before
    assert sorted(report.rejections) == [1, 2, 3, 4, 5, 6, 7]
    assert report.rejections[3].startswith("out_of_sync") and report.sync_scores[3] == pytest.approx(5.0, rel=1e-3)
    assert report.sync_scores[0] == 0.0
    expected = {1: "missing", 2: "timing", 3: "sync", 4: "format", 5: "format", 6: "format", 7: "format"}
    for uid, category in expected.items():
        assert state.peers[uid].offences == {category: 1}, uid
        assert state.peers[uid].mu == pytest.approx(-0.25 if uid == 3 else 0.3, abs=1e-15), uid
    assert report.evaluated == [0]                                             # 5 and 6 were chosen but fail to decode
    passed = poc_verdict(report.poc_statistics[0], hp.poc_threshold)
    assert state.peers[0].offences == {} and state.peers[0].mu == pytest.approx(poc_update(0.4, passed, hp.poc_gamma))
    assert str(Reason.BAD_KEYS.value) in report.rejections[6] and "malformed" in report.rejections[5]
    json.dumps(report.to_dict(), allow_nan=False)                              # loggable as one JSON line


def test_penalties_persist_across_windows_and_scores_are_recomputed_from_them(hp, dataset):
    hp.eval_peers = 1
    net = MiniNet(hp, dataset, {0: "honest", 1: "honest"})
    state = ValidatorState.new(secret=SECRET)
    state.peer(0).mu, state.peer(1).mu = 0.4, 0.4
    payloads = net.payloads(0)
    del payloads[1]
    first = run(net, state, 0, payloads)
    assert state.peers[1].mu == pytest.approx(0.3)
    previous = state.peers[1].mu
    for window in range(1, 4):
        report = run(net, state, window)
        assert 1 not in report.rejections
        mu = state.peers[1].mu
        if 1 in report.evaluated:                                # the EMA continues from the penalised μ
            passed = poc_verdict(report.poc_statistics[1], hp.poc_threshold)
            assert mu == pytest.approx(poc_update(previous, passed, 0.95))
        else:
            assert mu == previous
        previous = mu
        for uid in (0, 1):  # paid (a score > 0) only with proven work, no cooldown, μ at its floor and help
            peer = state.peers[uid]
            gates = poc_pays(peer.poc_record, peer.poc_failed_window, window, peer.mu, hp.poc_cooldown, hp.poc_floor,
                             hp.poc_threshold) and \
                help_gate(hp).helps(peer.help_ratios)
            assert (report.scores[uid] > 0) is (gates and sum(peer.work) > 0 and bool(peer.help_ratios))
    assert state.peers[1].offences == {"missing": 1} and first.rejections[1].startswith("missing")


# ------------------------------------------------------------- sign-safety exploit
def test_exploit_zeros_then_anti_training_then_noise_never_earns_weight(hp, dataset):
    hp.eval_peers = 5
    net = MiniNet(hp, dataset, {0: "honest", 1: "honest", 2: "zeros", 3: "zeros", 4: "noise"})
    state = ValidatorState.new(secret=SECRET)
    for window in range(10):
        net.behaviours[2] = "zeros" if window < 2 else ("anti" if window < 7 else "noise")
        report = run(net, state, window)
        assert report.weights[2] == 0.0 and report.scores[2] <= 0, window
        if window >= 2:
            assert 2 not in report.top_g, window
        total = sum(report.weights.values())
        assert total == 0.0 or total == pytest.approx(1.0)          # 0 only when nobody has a positive score
    attacker = state.peers[2]
    assert attacker.mu < 0 and attacker.loss_rating < 0                 # both factors negative …
    # … so the published PeerScore = μ·rating with the plain min-shift normalisation would pay it.
    naive = {uid: p.mu * p.loss_rating for uid, p in state.peers.items()}
    low = min(naive.values())
    naive_weight = (naive[2] - low) ** 2 / sum((v - low) ** 2 for v in naive.values())
    assert naive[2] > 0 and naive_weight > 0.01
    assert report.weights[0] > 0 and report.weights[1] > 0


# -------------------------------------------------------------------- restart
def test_restart_mid_run_gives_identical_weights(hp, dataset, tmp_path):
    hp.eval_peers, hp.fast_peers, hp.topg = 2, 3, 2          # small sets: the private randomness matters
    behaviours = {0: "honest", 1: "honest", 2: "stale", 3: "zeros", 4: "noise", 5: "honest"}

    def simulate(restart_after: int | None) -> tuple[list, dict]:
        net = MiniNet(hp, dataset, behaviours)
        state = ValidatorState.new(run_digest=hp.digest(), secret=SECRET)
        reports = []
        for window in range(7):
            reports.append(run(net, state, window))
            state.save(tmp_path / "state.json")
            if window == restart_after:
                state = load(tmp_path / "state.json", run_digest=hp.digest())
        return [(r.weights, r.top_g, r.evaluated, r.fast, r.loss_scores) for r in reports], state.to_dict()

    continuous, end_a = simulate(None)
    restarted, end_b = simulate(2)
    assert restarted == continuous
    assert end_a == end_b
    assert any(v > 0 for w, *_ in continuous[3:] for v in w.values())  # the comparison is not vacuous


# -------------------------------------------------------------------- bookkeeping
def test_cold_start_top_g_is_the_passing_peers_by_uid(hp, dataset):
    hp.topg = 2
    net = MiniNet(hp, dataset, {7: "zeros", 3: "zeros", 5: "zeros", 9: "zeros"})
    payloads = net.payloads(0)
    del payloads[3]
    state = ValidatorState.new(secret=SECRET)
    report = run(net, state, 0, payloads)
    # zero updates prove no work: a LossScore of 0 is not paid, and the help gate cuts them; uid 3 uploaded nothing
    assert report.scores == {3: 0.0, 5: 0.0, 7: 0.0, 9: 0.0} and state.peers[3].mu == 0
    assert report.top_g == [5, 7] and state.top_g == [5, 7]
    assert report.weights == {3: 0.0, 5: 0.0, 7: 0.0, 9: 0.0}


def test_a_window_is_scored_once_and_gaps_are_allowed(hp, dataset):
    net = MiniNet(hp, dataset, {0: "honest", 1: "zeros"})
    state = ValidatorState.new(secret=SECRET)
    run(net, state, 4)
    with pytest.raises(WindowAlreadyScored):
        run(net, state, 4)
    with pytest.raises(WindowAlreadyScored):
        run(net, state, 2)
    assert run(net, state, 9).window == 9


def test_plan_fast_set_predicts_the_fast_set(hp, dataset):
    hp.fast_peers = 2
    net = MiniNet(hp, dataset, {u: "zeros" for u in range(6)})
    state = ValidatorState.new(secret=SECRET)
    for window in range(3):
        planned = plan_fast_set(state, hp, window, range(6), eval_seed(window))
        assert run(net, state, window).fast == planned


def test_new_hotkey_on_a_uid_starts_from_scratch_and_inactive_uids_get_no_weight(hp, dataset):
    net = MiniNet(hp, dataset, {0: "honest", 1: "honest"})
    state = ValidatorState.new(secret=SECRET)
    run(net, state, 0, active={0: "hk-a", 1: "hk-b"})
    state.peers[1].offences = {"timing": 3}
    run(net, state, 1, active={0: "hk-a", 1: "hk-b"})
    assert state.peers[1].offences == {"timing": 3}
    report = run(net, state, 2, active={0: "hk-a", 1: "hk-new"})
    assert state.peers[1].hotkey == "hk-new" and state.peers[1].offences == {}
    assert state.peers[1].eval_count <= 1
    report = run(net, state, 3, active={0: "hk-a"})
    assert set(report.weights) == {0} and 1 in state.peers               # kept, but not paid while absent


def test_a_failing_window_leaves_the_state_untouched(hp, dataset):
    net = MiniNet(hp, dataset, {0: "honest", 1: "honest"})
    state = ValidatorState.new(secret=SECRET)
    state.peer(1).mu = 0.4
    payloads = net.payloads(0)
    del payloads[1]                                                   # would be penalised …
    before = state.to_dict()

    class BrokenDataset:                                              # … but evaluation then fails
        def __getattr__(self, name):
            raise RuntimeError("disk gone")

    with pytest.raises(RuntimeError):
        score(net, state, 0, payloads, active=[0, 1], dataset=BrokenDataset())
    assert state.to_dict() == before
    report = run(net, state, 0, payloads)                             # the retry penalises exactly once
    assert state.peers[1].mu == pytest.approx(0.3) and state.peers[1].offences == {"missing": 1}
    assert report.window == 0 and state.window == 0


def test_validators_with_different_secrets_evaluate_the_same_peers(hp, dataset):
    """S_t is drawn from the public eval seed: two validators that saw the same uploads pick the same peers
    (the old round-robin broke its ties with each validator's private secret)."""
    hp.eval_peers, hp.fast_peers = 2, 8
    picks = {}
    for name, schedule in (("random", DRAWN), ("round_robin", LeastRecentSchedule())):
        for secret in ("11" * 16, "22" * 16):
            net = MiniNet(hp, dataset, {u: "honest" for u in range(6)})
            state = ValidatorState.new(secret=secret)
            picks[name, secret] = [run(net, state, w, schedule=schedule).evaluated for w in range(4)]
    assert picks["random", "11" * 16] == picks["random", "22" * 16]
    assert picks["round_robin", "11" * 16] != picks["round_robin", "22" * 16]
    assert all(len(s) == 2 for s in picks["random", "11" * 16])


def test_validators_with_different_secrets_score_and_weight_alike_under_the_random_schedule(hp, dataset):
    """The evaluation data comes from the eval seed too, so two validators with different secrets that saw
    the same uploads produce the same LossScores and weights; under round-robin they do not."""
    hp.eval_peers, hp.fast_peers = 3, 8
    reports = {}
    for name, schedule in (("random", DRAWN), ("round_robin", LeastRecentSchedule())):
        for secret in ("11" * 16, "22" * 16):
            net = MiniNet(hp, dataset, {u: "honest" for u in range(5)})
            state = ValidatorState.new(secret=secret)
            reports[name, secret] = [run(net, state, w, schedule=schedule) for w in range(3)]
    same = [(a.loss_scores, a.weights) for a in reports["random", "11" * 16]]
    assert same == [(b.loss_scores, b.weights) for b in reports["random", "22" * 16]]
    assert any(a.loss_scores for a in reports["random", "11" * 16])
    assert [a.loss_scores for a in reports["round_robin", "11" * 16]] != \
        [b.loss_scores for b in reports["round_robin", "22" * 16]]
