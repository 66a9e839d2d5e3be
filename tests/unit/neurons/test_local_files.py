"""Every file a node keeps, corrupted, fails with its documented error (docs/protocol.md,
"Files a node keeps") — and the validator resumes from its last good save, or a clean state, instead of
stopping on a damaged one."""
from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

from dso.chain.wallets import WalletError, create_local_wallet, load_wallet
from dso.codec.demo import DeMoCodec, ErrorFeedback
from dso.config.schema import ModelConfig, WalletConfig
from dso.nn.model import build_model, model_hash, parameter_shapes
from dso.privacy.dp import PrivacyStateError, RdpAccountant
from neurons import validator_state
from neurons.persist import load_json, load_tensors, save_json, save_tensors
from scoring.state import ForeignRunError, StateError, ValidatorState

torch.set_num_threads(1)
TINY = ModelConfig(vocab_size=64, d_model=16, n_layers=1, n_heads=2, ffn_hidden=32, seq_len=8)
RUN = "run-digest-1"

# ways a file on disk gets damaged: each must give the documented outcome, never another exception
DAMAGE = {
    "truncated": lambda raw: raw[: len(raw) // 2],
    "empty": lambda raw: b"",
    "garbage": lambda raw: b"\xff\xfe\x00 not what was written" * 10,
    "absurd header length": lambda raw: (2 ** 62).to_bytes(8, "little") + raw[8:],
    "deeply nested": lambda raw: b"[" * 200_000,
    "flipped byte": lambda raw: raw[:12] + bytes([raw[12] ^ 0x5A]) + raw[13:],
}


@pytest.fixture
def model():
    return build_model(TINY, seed=3)


# ------------------------------------------------------------ miner: error-feedback buffer
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_error_feedback_buffer_is_logged_and_not_used(tmp_path, model, damage, caplog):
    """The miner's ef file (neurons/miner.py loads it with load_tensors): a damaged one raised
    SafetensorError and stopped the miner; now load_tensors returns None with a warning naming the file,
    and the miner starts with an empty buffer."""
    codec = DeMoCodec(parameter_shapes(model), chunk=8, topk=4)
    feedback = ErrorFeedback(codec, 0.9, torch.device("cpu"))
    path = tmp_path / "error_feedback.safetensors"
    save_tensors(path, feedback.state())
    path.write_bytes(DAMAGE[damage](path.read_bytes()))
    with caplog.at_level(logging.WARNING, logger="dso.files"):
        saved = load_tensors(path)
    if saved is not None:  # a flipped byte may leave a readable file: then load_state judges it
        assert damage == "flipped byte"
        feedback.load_state(saved)
        return
    assert str(path) in caplog.text and "damaged" in caplog.text
    assert load_tensors(tmp_path / "absent.safetensors") is None  # absent: None, silently


def test_error_feedback_of_another_model_is_not_loaded(tmp_path, model):
    codec = DeMoCodec(parameter_shapes(model), chunk=8, topk=4)
    path = tmp_path / "ef.safetensors"
    save_tensors(path, {"ef.other": torch.zeros(3)})
    assert ErrorFeedback(codec, 0.9, torch.device("cpu")).load_state(load_tensors(path)) is False


# ------------------------------------------------------------ validator: saved folders
def _save(root, model, window: int, digest: str = RUN) -> str:
    state = ValidatorState.new(digest)
    state.window = window
    book = validator_state.Bookkeeping(window, {window: [1, 2]}, run="0123456789abcdef")
    validator_state.save(root, state, model, book)
    return model_hash(model)


def _nudge(model, amount: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(amount)


@pytest.mark.parametrize("victim", ["model.safetensors", "scoring.json", "meta.json"])
@pytest.mark.parametrize("damage", ["truncated", "garbage", "deeply nested"])
def test_validator_resumes_from_the_last_good_folder(tmp_path, model, victim, damage, caplog):
    """A damaged file in the newest save: the folder is skipped (logged with its name and why) and the
    validator resumes from the one before, θ included.  Before, meta.json nested deeply raised
    RecursionError, a damaged model file SafetensorError, and any StateError stopped the validator."""
    good_hash = _save(tmp_path, model, 10)
    _nudge(model, 0.01)
    _save(tmp_path, model, 11)
    path = tmp_path / "w11" / victim
    path.write_bytes(DAMAGE[damage](path.read_bytes()))
    fresh = build_model(TINY, seed=3)
    _nudge(fresh, 0.5)
    with caplog.at_level(logging.WARNING, logger="dso.validator"):
        loaded = validator_state.load(tmp_path, fresh, RUN)
    assert loaded is not None
    scores, book = loaded
    assert scores.window == 10 and book.model_window == 10 and model_hash(fresh) == good_hash
    assert "skipping saved folder" in caplog.text and "w11" in caplog.text and victim in caplog.text


def test_validator_starts_clean_when_no_folder_loads_and_keeps_its_model(tmp_path, model, caplog):
    _save(tmp_path, model, 5)
    _save(tmp_path, model, 6)
    for folder in ("w5", "w6"):
        (tmp_path / folder / "scoring.json").write_bytes(b"[" * 100_000)
    before = model_hash(model)
    with caplog.at_level(logging.WARNING, logger="dso.validator"):
        assert validator_state.load(tmp_path, model, RUN) is None
    assert model_hash(model) == before and "clean state" in caplog.text


def test_a_model_file_failing_its_hash_leaves_the_model_untouched(tmp_path, model):
    _save(tmp_path, model, 3)
    meta = load_json(tmp_path / "w3" / "meta.json")
    save_json(tmp_path / "w3" / "meta.json", {**meta, "model_hash": "00" * 32})
    other = build_model(TINY, seed=9)
    before = model_hash(other)
    with pytest.raises(StateError, match="does not match the hash"):
        validator_state.load_folder(tmp_path / "w3", other, RUN)
    assert model_hash(other) == before


def test_state_of_an_earlier_version_is_skipped_with_the_reason(tmp_path, model, caplog):
    """The other half of bounding μ (test_scoring_formulas.py): a state whose μ went to -inf (or any version-1
    state) was refused and the validator stopped; now it is skipped with the reason, and with nothing else saved
    it starts clean."""
    _save(tmp_path, model, 8)
    path = tmp_path / "w8" / "scoring.json"
    data = json.loads(path.read_text())
    data["version"] = 1  # what the previous release wrote
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="dso.validator"):
        assert validator_state.load(tmp_path, model, RUN) is None
    assert "earlier version" in caplog.text


def test_state_of_another_run_still_stops_the_validator(tmp_path, model):
    _save(tmp_path, model, 2, digest="some-other-run")
    with pytest.raises(ForeignRunError, match="move the file away"):
        validator_state.load(tmp_path, model, RUN)


def test_current_pointer_damaged_or_missing(tmp_path, model):
    _save(tmp_path, model, 4)
    (tmp_path / "current").write_bytes(b"\xff\xfe")
    assert validator_state.load(tmp_path, model, RUN)[1].model_window == 4  # the folders are still found
    shutil.rmtree(tmp_path / "w4")
    assert validator_state.load(tmp_path, model, RUN) is None


# ------------------------------------------------------------ miner: privacy accountant
@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "deeply nested", "huge number",
                                    "huge rounds"])
def test_damaged_privacy_accountant_is_a_privacy_state_error(tmp_path, damage):
    """The miner stops with PrivacyStateError's message (never resets the budget silently); a deeply
    nested or huge-number file raised RecursionError / OverflowError instead."""
    path = tmp_path / "privacy.json"
    RdpAccountant(1.0, 1e-6, range(2, 8)).save(path)
    raw = path.read_bytes()
    state = json.loads(raw)
    damaged = {"huge number": json.dumps({**state, "noise_multiplier": 10 ** 400}).encode(),
               "huge rounds": json.dumps({**state, "rounds": 10 ** 400}).encode()}.get(damage)
    path.write_bytes(damaged if damaged is not None else DAMAGE[damage](raw))
    with pytest.raises(PrivacyStateError, match="privacy"):
        RdpAccountant.load(path)


# ------------------------------------------------------------ wallets
@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "deeply nested"])
def test_damaged_hotkey_is_a_wallet_error_naming_the_file(tmp_path, damage):
    create_local_wallet("w", "h", str(tmp_path))
    hotkey = tmp_path / "w" / "hotkeys" / "h"
    hotkey.write_bytes(DAMAGE[damage](hotkey.read_bytes()))
    with pytest.raises(WalletError, match=str(hotkey)):
        load_wallet(WalletConfig("w", "h", str(tmp_path)))
