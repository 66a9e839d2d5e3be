"""Validator state: exact JSON round trip, atomic save, strict load, restart-proof randomness."""
from __future__ import annotations

import json
import math
import os

import pytest

from scoring.state import ForeignRunError, PeerState, StateError, ValidatorState, load, load_or_new


def sample_state() -> ValidatorState:
    state = ValidatorState.new(run_digest="abc123", secret="0f" * 16)
    state.window = 41
    state.peers[3] = PeerState(hotkey="5Fhot", mu=0.1 + 0.2, rating_mu=27.123456789012345, rating_sigma=7.9,
                               loss_score=-math.inf, delta_assigned=1e-300, sync_score=math.inf, eval_count=4,
                               last_eval_window=40, last_fast_window=41, offences={"sync": 2, "timing": 1},
                               last_offence="too_late: 12 s after close", copies=2, passes=7,
                               help_ratios=[-1.0, 0.375])
    state.peers[11] = PeerState(mu=-0.049999999999999996)
    state.top_g, state.evaluated, state.fast = [3], [3, 11], [3, 11]
    state.weights = {3: 1 / 3, 11: 2 / 3}
    return state


def test_round_trip_is_exact(tmp_path):
    state = sample_state()
    path = tmp_path / "v" / "state.json"
    state.save(path)
    again = load(path, run_digest="abc123")
    assert again == state
    assert again.peers[3].mu == 0.1 + 0.2                       # the exact double, not 0.3
    assert again.peers[3].loss_score == -math.inf and again.peers[3].sync_score == math.inf
    assert again.weights[3] == 1 / 3
    json.loads(path.read_text())                                # standard JSON (no Infinity/NaN tokens)
    assert "Infinity" not in path.read_text()


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path, monkeypatch):
    path = tmp_path / "state.json"
    first = sample_state()
    first.save(path)
    before = path.read_bytes()
    changed = sample_state()
    changed.window = 99

    def broken_replace(src, dst):
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        changed.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before                          # the old state survives a failed save
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
    changed.save(path)
    assert load(path).window == 99


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("peers"), "missing fields"),
    (lambda d: d.update(extra=1), "unknown fields"),
    (lambda d: d.update(version=1), "earlier version"),
    (lambda d: d.update(version=2), "earlier version"),
    (lambda d: d.update(version=4), "version"),
    (lambda d: d.update(version="3"), "version"),
    (lambda d: d["peers"]["3"].update(mu=-1.5), "peers.3.mu.*outside its bounds"),
    (lambda d: d["peers"]["3"].update(rating_mu=1e6), "rating_mu.*outside"),
    (lambda d: d.update(weights={"3": 2.0}), "weights.3"),
    (lambda d: d.update(window=10 ** 30), "window.*out of range"),
    (lambda d: d.update(top_g=[10 ** 30]), "top_g"),
    (lambda d: d.update(window="41"), "window"),
    (lambda d: d.update(secret="xyz"), "secret"),
    (lambda d: d["peers"]["3"].update(mu="lots"), "peers.3.mu"),
    (lambda d: d["peers"]["3"].update(mu="inf"), "finite"),
    (lambda d: d["peers"]["3"].update(eval_count=True), "eval_count"),
    (lambda d: d["peers"]["3"].update(copies=-1), "peers.3.copies"),
    (lambda d: d["peers"]["3"].update(passes="2"), "peers.3.passes"),
    (lambda d: d["peers"]["3"].update(help_ratios=[0.5, 1.5]), "peers.3.help_ratios.1."),
    (lambda d: d["peers"]["3"].update(help_ratios=["nan"]), "peers.3.help_ratios.0."),
    (lambda d: d["peers"]["3"].update(poc_record=[2.0, 11.0]), "peers.3.poc_record"),
    (lambda d: d["peers"]["3"].update(poc_record=["nan"]), "peers.3.poc_record"),
    (lambda d: d["peers"]["3"].update(work=[144, -1]), "peers.3.work"),
    (lambda d: d["peers"]["3"].update(poc_failed_window=-2), "peers.3.poc_failed_window"),
    (lambda d: d["peers"]["3"].update(rating_sigma=0.0), "rating_sigma"),
    (lambda d: d["peers"]["3"]["offences"].update(bribery=1), "bribery"),
    (lambda d: d["peers"].update({"x": d["peers"]["3"]}), "not a uid"),
    (lambda d: d.update(top_g=[1, -2]), "top_g"),
])
def test_load_rejects_every_malformed_field_with_its_name(tmp_path, mutate, message):
    data = sample_state().to_dict()
    mutate(data)
    path = tmp_path / "state.json"
    path.write_text(json.dumps(data))
    with pytest.raises(StateError, match=message):
        load(path)


def test_load_errors_for_missing_corrupt_and_foreign_files(tmp_path):
    with pytest.raises(StateError, match="no such file"):
        load(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_bytes(b"{\"version\": 1, \"secr")
    with pytest.raises(StateError, match="bad.json"):
        load(tmp_path / "bad.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(StateError):
        load(tmp_path / "bin.json")
    sample_state().save(tmp_path / "other.json")
    with pytest.raises(ForeignRunError, match="saved for run abc123"):
        load(tmp_path / "other.json", run_digest="def456")


@pytest.mark.parametrize("damage", [
    lambda text: "[" * 200_000,                                               # RecursionError before
    lambda text: text.replace('"mu": 0.30000000000000004', '"mu": 1' + "0" * 400),  # OverflowError before
    lambda text: text.replace('"window": 41', '"window": 1' + "0" * 5000),     # int parser's digit limit
    lambda text: text[: len(text) // 2],
    lambda text: text.replace('"peers": {', '"peers": {"5": [], '),
])
def test_a_damaged_state_file_is_a_state_error_never_another_exception(tmp_path, damage):
    """A damaged state raised RecursionError or OverflowError instead of the documented StateError."""
    path = tmp_path / "scoring.json"
    sample_state().save(path)
    text = path.read_text()
    damaged = damage(text)
    assert damaged != text
    path.write_text(damaged)
    with pytest.raises(StateError, match="scoring.json"):
        load(path)


def test_load_or_new(tmp_path):
    fresh = load_or_new(tmp_path / "none.json", run_digest="r1")
    assert fresh.window == -1 and fresh.peers == {} and len(fresh.secret) == 32 and fresh.run_digest == "r1"
    assert load_or_new(tmp_path / "none.json").secret != fresh.secret     # a new secret per new validator
    sample_state().save(tmp_path / "s.json")
    assert load_or_new(tmp_path / "s.json").window == 41


def test_private_randomness_depends_on_secret_window_and_purpose_only(tmp_path):
    state = sample_state()
    state.save(tmp_path / "s.json")
    again = load(tmp_path / "s.json")
    assert state.rng(7, 1).integers(1 << 62) == again.rng(7, 1).integers(1 << 62)
    draws = {state.rng(7, 1).integers(1 << 62), state.rng(8, 1).integers(1 << 62),
             state.rng(7, 2).integers(1 << 62), ValidatorState.new(secret="10" * 16).rng(7, 1).integers(1 << 62)}
    assert len(draws) == 4


def test_standing_orders_peers_by_last_weight_then_mu_then_uid():
    state = ValidatorState.new(secret="0f" * 16)
    for uid, mu in ((1, 0.2), (2, 0.5), (3, -0.3), (4, 0.5), (5, 0.0)):
        state.peers[uid] = PeerState(mu=mu)
    state.weights = {3: 0.6, 1: 0.4}
    assert state.standing() == [3, 1, 2, 4, 5]


def test_a_state_of_the_earlier_proof_of_computation_is_refused_with_how_to_start_afresh(tmp_path):
    data = sample_state().to_dict()
    data["version"] = 2
    for peer in data["peers"].values():
        del peer["poc_record"], peer["work"], peer["poc_failed_window"]
    path = tmp_path / "state.json"
    path.write_text(json.dumps(data))
    with pytest.raises(StateError, match="earlier version.*move the state away"):
        load(path, run_digest="abc123")
