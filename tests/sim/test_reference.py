"""The local run's centralised AdamW reference curve (sim/reference.py) and its place in the report."""
from __future__ import annotations

import math

import pytest
import torch

from dso.data import Dataset
from sim import reference
from sim import report as run_report

torch.set_num_threads(1)


def test_network_tokens_count_only_the_good_miners_by_window():
    miners = {1: [{"window": 4, "tokens": 100}, {"window": 5, "tokens": 300}, {"event": "x"}],
              2: [{"window": 5, "tokens": 50}], 3: [{"window": 4, "tokens": 10_000}]}
    assert reference.network_tokens(miners, {1, 2}) == {4: 100, 5: 350}


def test_reference_points_sit_where_the_network_had_as_many_tokens():
    per_window = {4: 100, 5: 300}  # 100 tokens by the end of window 4, 400 by the end of window 5
    assert reference.on_windows([0, 50, 100, 250, 400, 900], per_window) == pytest.approx([3, 3.5, 4, 4.5, 5, 5])
    assert reference.on_windows([0, 10], {}) == []


def test_adamw_reference_trains_the_tokens_and_is_cached(tmp_path, tiny_hparams, stdlib_corpus):
    hp = tiny_hparams
    dataset = Dataset.for_run(hp, str(stdlib_corpus), str(tmp_path / "data"))
    tokens = 3 * 2 * hp.batch_size * dataset.seq_len  # 3 windows × 2 steps
    said: list[str] = []
    ref = reference.adamw_reference(hp, dataset, tokens, 3, tmp_path / "cache", seconds=600, say=said.append)
    assert ref is not None and ref["complete"] and not ref["cached"] and ref["steps"] == 6
    assert ref["tokens"] == [0, tokens // 3, 2 * tokens // 3, tokens]
    assert ref["val_loss"][-1] < ref["val_loss"][0]            # it learns
    assert ref["bits_per_byte"][0] == pytest.approx(ref["val_loss"][0] / math.log(2))  # byte tokens
    again = reference.adamw_reference(hp, dataset, tokens, 3, tmp_path / "cache", seconds=600, say=said.append)
    assert again["cached"] and again["val_loss"] == ref["val_loss"]
    cut = reference.adamw_reference(hp, dataset, 2 * tokens, 3, tmp_path / "cache", seconds=0, say=said.append)
    assert not cut["complete"] and cut["tokens"] == [0]          # no time: only θ_0
    assert not reference.cache_file(tmp_path / "cache", hp, dataset.data_hash, 2 * tokens, 3).exists()


def test_report_draws_and_quotes_the_reference():
    lines = [{"window": 10 + i, "val_loss": 3.0 - 0.5 * i, "val_bits_per_byte": (3.0 - 0.5 * i) / math.log(2),
              "weights": {"1": 1.0}} for i in range(3)]
    report = run_report.build(lines, {1: ("miner0", "honest")}, {1: 1.0})
    ref = {"tokens": [0, 100, 200], "val_loss": [3.0, 2.2, 1.9], "bits_per_byte": [4.3, 3.2, 2.7],
           "target_tokens": 200, "steps": 2, "batch_sequences": 4, "lr": 2e-3, "complete": True}
    run_report.add_reference(report, ref, {10: 100, 11: 100})
    assert report["reference_adamw"]["windows"] == pytest.approx([9, 10, 11])
    assert report["reference_final_bits_per_byte"] == 2.7
    assert "centralised AdamW on the 200 tokens" in run_report.markdown(report)
    from sim.report_html import render
    assert "2.700 bits/byte" in render(report)
    figs = run_report.figures(report)
    try:
        labels = [line.get_label() for line in figs["val_loss"].axes[0].get_lines()]
        assert "centralised AdamW, same tokens" in labels
    finally:
        import matplotlib.pyplot as plt
        for fig in figs.values():
            plt.close(fig)
