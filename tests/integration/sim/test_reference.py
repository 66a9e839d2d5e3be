"""The local run's centralised AdamW reference curve (sim/reference.py) and its place in the report."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from dso.data.dataset import Dataset
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


@pytest.fixture(scope="module")
def three_rounds(tmp_path_factory, make_tiny_hparams, stdlib_corpus):
    """One reference trained from nothing on two and a half rounds' tokens (three rounds are trained), shared by
    the tests below: (hparams, dataset, cache folder, what ``adamw_reference`` returned)."""
    hp, tmp = make_tiny_hparams(), tmp_path_factory.mktemp("reference")
    dataset = Dataset.for_run(hp, str(stdlib_corpus), str(tmp / "data"))
    per_round = reference.ROUND_STEPS * hp.batch_size * dataset.seq_len
    tokens = 2 * per_round + per_round // 2
    cache = tmp / "cache"
    ref = reference.adamw_reference(hp, dataset, tokens, cache, seconds=600, say=lambda line: None,
                                    shipped=tmp / "nothing shipped")
    return hp, dataset, cache, ref


def stored_curve(hp, dataset, cache) -> dict:
    return json.loads((cache / "reference" / reference.cache_name(hp, dataset.data_hash)).read_text())


def test_a_curve_for_fewer_rounds_is_the_prefix_of_one_for_more(three_rounds):
    """What lets one cached curve serve every run: the trajectory does not depend on how far it will go."""
    hp, dataset, cache, _ = three_rounds
    short = reference.train_curve(hp, dataset, 2, math.inf, say=lambda line: None)
    long = stored_curve(hp, dataset, cache)  # three rounds, trained by adamw_reference
    per_round = reference.ROUND_STEPS * hp.batch_size * dataset.seq_len
    assert long["tokens"] == [0, per_round, 2 * per_round, 3 * per_round] and long["complete"]
    assert short["val_loss"] == long["val_loss"][:3] and long["val_loss"][-1] < long["val_loss"][0]
    assert long["bits_per_byte"][0] == pytest.approx(long["val_loss"][0] / math.log(2))  # byte tokens


def test_adamw_reference_reads_the_prefix_at_the_networks_tokens_and_is_cached(tmp_path, three_rounds):
    hp, dataset, cache, ref = three_rounds
    per_round = reference.ROUND_STEPS * hp.batch_size * dataset.seq_len
    tokens = 2 * per_round + per_round // 2  # two and a half rounds: three are trained, the last point interpolated
    none = tmp_path / "nothing shipped"
    assert ref is not None and ref["complete"] and not ref["cached"]
    assert ref["tokens"] == [0, per_round, 2 * per_round, tokens] and ref["target_tokens"] == tokens
    assert ref["steps"] == math.ceil(tokens / (hp.batch_size * dataset.seq_len))
    stored = stored_curve(hp, dataset, cache)
    assert stored["tokens"][-1] == 3 * per_round      # the cache keeps the whole curve
    assert ref["val_loss"][-1] == pytest.approx((stored["val_loss"][2] + stored["val_loss"][3]) / 2)
    fewer = reference.adamw_reference(hp, dataset, per_round, cache, seconds=0, say=lambda line: None, shipped=none)
    assert fewer["cached"] and fewer["val_loss"] == stored["val_loss"][:2]  # no time needed: read from the cache
    more = reference.adamw_reference(hp, dataset, 4 * per_round, cache, seconds=0, say=lambda line: None,
                                     shipped=none)
    assert not more["complete"] and not more["cached"] and more["tokens"] == [0]  # no time: only θ_0
    assert stored_curve(hp, dataset, cache) == stored


def test_a_shipped_curve_serves_a_fresh_cache_and_a_bad_one_is_ignored(tmp_path, tiny_hparams, stdlib_corpus):
    hp = tiny_hparams
    dataset = Dataset.for_run(hp, str(stdlib_corpus), str(tmp_path / "data"))
    name = reference.cache_name(hp, dataset.data_hash)
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    curve = {"tokens": [0, 100, 200], "val_loss": [5.0, 4.0, 3.0], "bits_per_byte": [7.0, 6.0, 5.0],
             "batch_sequences": 4, "lr": 2e-3, "complete": True}
    (shipped / name).write_text(json.dumps(curve))
    got = reference.adamw_reference(hp, dataset, 150, tmp_path / "fresh", seconds=0, say=lambda line: None,
                                    shipped=shipped)
    assert got["cached"] and got["tokens"] == [0, 100, 150] and got["val_loss"] == [5.0, 4.0, 3.5]
    for bad in ({**curve, "complete": False}, {**curve, "val_loss": [5.0, "4", 3.0]}, {**curve, "tokens": [0]}, []):
        (shipped / name).write_text(json.dumps(bad))
        assert not reference.adamw_reference(hp, dataset, 150, tmp_path / "fresh", seconds=0,
                                             say=lambda line: None, shipped=shipped)["cached"]
    # settings that do not change the trajectory share the curve; the inner lr does not
    other = dataclasses.replace(hp, topg=3, blocks_per_window=7)
    assert reference.cache_name(other, dataset.data_hash) == name
    assert reference.cache_name(dataclasses.replace(hp, inner=dataclasses.replace(hp.inner, lr=1e-3)),
                                dataset.data_hash) != name


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


def test_the_shipped_curve_is_the_default_runs_and_covers_it(tmp_path):
    """A default changed that moves the reference → this fails: regenerate the shipped curve with
    ``python -m sim.reference --tokens 1500000 --out sim/reference_cache`` (docs/training.md)."""
    from dso.config.schema import Config

    hp = Config().validate().hparams
    dataset = Dataset.for_run(hp, "shakespeare", str(tmp_path / "data"))  # a fresh data cache, as on a new machine
    path = reference.SHIPPED / reference.cache_name(hp, dataset.data_hash)
    assert path.exists(), f"no shipped reference curve for the default settings ({path.name})"
    per_round = reference.ROUND_STEPS * hp.batch_size * dataset.seq_len
    curve = reference.read_cached(path, math.ceil(1_200_000 / per_round))  # longer than any default run so far
    assert curve is not None and curve["val_loss"][-1] < curve["val_loss"][0]
    assert sorted(p.name for p in reference.SHIPPED.glob("*.json")) == [path.name]  # no stale curve beside it
