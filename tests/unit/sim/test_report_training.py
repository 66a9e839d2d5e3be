"""The local network report's training figures and text sampled from a checkpoint."""
from __future__ import annotations

import math

import numpy as np
import pytest
import safetensors.torch
import torch

from dso.data.dataset import Dataset
from dso.nn.model import build_model
from sim import report as run_report
from sim import sample

torch.set_num_threads(1)

PEERS = {1: ("miner0", "honest"), 2: ("diligent0", "diligent"), 3: ("noise0", "noise")}


def test_unigram_entropy_by_hand():
    # "aab": p = 2/3, 1/3 → −(2/3·log2 2/3 + 1/3·log2 1/3) = 0.91830 bits per byte
    counts = np.zeros(256)
    counts[ord("a")], counts[ord("b")] = 2, 1
    assert run_report.unigram_bits_per_byte(counts, np.ones(256)) == pytest.approx(0.918296, abs=1e-6)
    # p = 1/2, 1/4, 1/4 → 1.5 bits per token; 4 tokens stand for 2·2 + 1 + 1 = 6 bytes → 1.5 · 4 / 6 = 1.0
    assert run_report.unigram_bits_per_byte([2, 1, 1], [2, 1, 1]) == pytest.approx(1.0)
    assert run_report.unigram_bits_per_byte([5, 0, 0], [1, 1, 1]) == 0.0
    with pytest.raises(ValueError):
        run_report.unigram_bits_per_byte([0, 0], [1, 1])


def test_corpus_unigram_entropy_of_a_data_set():
    """Five sequences of ids [0, 0, 1, 2] (seq_len 3): p = 1/2, 1/4, 1/4 → 1.5 bits per byte."""
    tokens = np.tile(np.array([0, 0, 1, 2], dtype=np.uint16), 5)
    dataset = Dataset(np.concatenate([tokens, np.array([7, 7], np.uint16)]), "h", seq_len=3, seed=0)
    assert dataset.n_sequences == 5                                  # the trailing partial row is not read
    assert run_report.corpus_unigram_bits_per_byte(dataset) == pytest.approx(1.5)
    assert run_report.corpus_unigram_bits_per_byte(dataset, max_sequences=4, block=3) == pytest.approx(1.5)


def _lines(windows: int = 3) -> list[dict]:
    return [{"window": 10 + i, "val_loss": 3.0 - 0.5 * i, "val_bits_per_byte": (3.0 - 0.5 * i) / math.log(2),
             "weights": {"1": 0.4, "2": 0.6, "3": 0.0}} for i in range(windows)]


def _miners() -> dict[int, list[dict]]:
    return {1: [{"window": 11, "utilisation": 0.8, "tokens": 2048}, {"window": 12, "utilisation": 0.9, "tokens": 4096},
                {"window": 10, "utilisation": 0.2, "tokens": 1000}, {"event": "started"}],
            2: [{"window": 10, "utilisation": 0.95, "tokens": 8192}],
            3: [{"window": 10, "utilisation": 0.1, "tokens": 100}]}


def test_report_carries_tokens_utilisation_and_bits():
    report = run_report.build(_lines(), PEERS, {1: 0.4, 2: 0.6}, miners=_miners(), unigram_bpb=4.8)
    assert report["final_val_bits_per_byte"] == pytest.approx(2.0 / math.log(2))
    assert report["unigram_bits_per_byte"] == 4.8
    assert report["tokens"] == 1000 + 2048 + 4096 + 8192 + 100          # every miner's training tokens
    # honest and diligent miners only, without the window each joined in (miner 1's window 10); a miner with
    # one window keeps it
    assert report["miner_utilisation"] == {"1": 0.85, "2": 0.95}
    s = report["summary"]
    assert s["miner_utilisation_mean"] == pytest.approx(0.9) and s["miner_utilisation_min"] == pytest.approx(0.85)
    assert s["miner_utilisation_mean_all_windows"] == pytest.approx((1.9 / 3 + 0.95) / 2)
    assert s["tokens"] == 15436
    assert [r.get("windows") for r in report["peers"]] == [3, 1, 1]
    report["samples"] = [{"window": 12, "prompt": "ROMEO:\n", "text": "Thou art"}]
    text = run_report.markdown(report)
    assert "unigram entropy: 4.800 bits/byte" in text and "processed: 15,436" in text
    assert "mean 90.0%, lowest 85.0%" in text and "ROMEO:\nThou art" in text
    from sim.report_html import render
    page = render(report)
    assert "4.800 bits/byte" in page and "15,436" in page and "90.0% (85.0%)" in page and "Thou art" in page


def test_report_without_miner_lines_or_corpus():
    report = run_report.build(_lines(), PEERS, None)
    assert report["tokens"] is None and report["miner_utilisation"] == {} and report["unigram_bits_per_byte"] is None
    assert "unigram" not in run_report.markdown(report)


def test_validation_plot_has_the_unigram_line():
    report = run_report.build(_lines(), PEERS, None, unigram_bpb=4.8)
    figs = run_report.figures(report)
    try:
        ax = figs["val_loss"].axes[0]
        flat = [line for line in ax.get_lines() if len(set(line.get_ydata())) == 1]
        assert len(flat) == 1
        assert flat[0].get_ydata()[0] == pytest.approx(4.8 * math.log(2))  # in nats on the left axis
        assert "4.80 bits/byte" in flat[0].get_label()
    finally:
        import matplotlib.pyplot as plt
        for fig in figs.values():
            plt.close(fig)


# ------------------------------------------------------------------ sampling
def _checkpoint(tmp_path, hp, extra: dict | None = None):
    model = build_model(hp.model, hp.seed + 1)                        # not θ_0: the file's weights must load
    folder = tmp_path / "validator" / "w7"
    folder.mkdir(parents=True)
    tensors = {n: p.detach().clone() for n, p in model.named_parameters()} | (extra or {})
    safetensors.torch.save_file(tensors, str(folder / "model.safetensors"))
    (tmp_path / "validator" / "current").write_text("w7")
    return model, tmp_path / "validator"


def test_load_model_from_a_validator_state_folder(tmp_path, tiny_hparams):
    want, folder = _checkpoint(tmp_path, tiny_hparams, {"outer.steps": torch.zeros(1)})
    model = sample.load_model(folder, tiny_hparams)
    assert all(torch.equal(p, dict(want.named_parameters())[n]) for n, p in model.named_parameters())
    assert sample.checkpoint_window(folder) == 7
    assert sample.find_checkpoint(tmp_path) == folder / "w7" / "model.safetensors"


def test_a_checkpoint_of_another_model_is_refused(tmp_path, tiny_hparams):
    _, folder = _checkpoint(tmp_path, tiny_hparams)
    tiny_hparams.model.d_model = 64
    with pytest.raises(sample.CheckpointError, match="of shape"):
        sample.load_model(folder, tiny_hparams)
    (tmp_path / "empty").mkdir()
    with pytest.raises(sample.CheckpointError, match="no model.safetensors"):
        sample.find_checkpoint(tmp_path / "empty")


def test_greedy_and_seeded_sampling(tmp_path, tiny_hparams):
    _, folder = _checkpoint(tmp_path, tiny_hparams)
    model = sample.load_model(folder, tiny_hparams)
    prompt = [72, 105]
    greedy = sample.generate(model, prompt, 20)
    with torch.no_grad():                                             # greedy: the argmax of every step
        logits = model(torch.tensor([prompt]))[0, -1]
    assert greedy[0] == int(logits.argmax()) and greedy == sample.generate(model, prompt, 20)
    assert len(greedy) == 20 and all(0 <= i < 256 for i in greedy)     # past seq_len (16): the context slides
    hot = sample.generate(model, prompt, 20, temperature=5.0, seed=3)
    assert hot == sample.generate(model, prompt, 20, temperature=5.0, seed=3)
    assert hot != sample.generate(model, prompt, 20, temperature=5.0, seed=4)
    from dso.data.tokenizer import Tokenizer
    rows = sample.samples_from(model, Tokenizer.bytes(), 7, prompts=("A", "B"), new_tokens=5, seed=1)
    assert [(r["window"], r["prompt"], r["seed"]) for r in rows] == [(7, "A", 1), (7, "B", 2)]
    assert all(r["text"] for r in rows)
