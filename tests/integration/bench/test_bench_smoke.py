"""The benchmark sections' pure helpers: required keys and formulas against hand-computed values.

No timing assertions: only the arithmetic the benchmark applies to its measurements.
"""
from __future__ import annotations

import json
import math
import os
import sys

import pytest
import torch
from scipy.special import gammaln

from repo import ROOT

torch.set_num_threads(1)
sys.path.insert(0, str(ROOT / "scripts"))

from benchmarks import (  # noqa: E402  # noqa: E402
    MODULES,
    SECTIONS,
    convergence,
    energy,
    extra_compute,
    gather,
    generic_markdown,
    incentives,
    markdown,
    privacy,
    targets,
    training,
    validator,  # noqa: E402
)
from benchmarks import codec as codec_section  # noqa: E402
from benchmarks.common import finite_or_none, proc_peak_rss_mb  # noqa: E402
from dso.codec.demo import DeMoCodec  # noqa: E402


def test_every_issue_section_is_registered():
    assert {"codec", "validator", "gather", "convergence", "sketch", "robust", "privacy", "incentives",
            "training", "scale"} <= set(SECTIONS)
    assert list(SECTIONS)[-1] == "convergence"  # the longest runs last


# ------------------------------------------------------------------ codec
def test_codec_measure_matches_hand_computed_sizes():
    codec = DeMoCodec({"w": (64, 64)}, chunk=64, topk=32, value_bits=4)
    out = codec_section.measure(codec, {}, repeats=0)
    # one 64x64 chunk: Elias-Fano 32*7 low bits + (32 + 4095 // 128) high bits = 287 bits -> 36 bytes,
    # 32 four-bit codes = 16 bytes, a table of 2^3 float32 level magnitudes = 32 bytes
    assert out["payload_bytes"] == 36 + 16 + 32
    assert out["kept"] == 32
    assert out["bytes_per_kept"] == pytest.approx(84 / 32)
    assert out["ratio_vs_fp32"] == pytest.approx(4 * 4096 / 84)
    log2_comb = (gammaln(4097) - gammaln(33) - gammaln(4097 - 32)) / math.log(2)  # log2 C(4096, 32)
    assert out["bound_bytes_per_kept"] == pytest.approx((log2_comb / 32 + 4) / 8, rel=1e-6)
    assert out["within_bound_pct"] == pytest.approx(100 * (out["bytes_per_kept"] / out["bound_bytes_per_kept"] - 1))
    assert out["vs_templar_2_5_bytes"] == pytest.approx(2.5 / out["bytes_per_kept"])


def test_codec_measure_times_when_asked():
    codec = DeMoCodec({"w": (32, 32), "b": (32,)}, chunk=16, topk=8, value_bits=4)
    tensors = {"w": torch.randn(32, 32), "b": torch.randn(32)}
    out = codec_section.measure(codec, tensors, repeats=1)
    assert out["encode_ms"] > 0 and out["decode_ms"] > 0


def test_compression_share_of_window():
    assert codec_section.compression_share(10.0, 5.0, 135.0) == pytest.approx(0.1)
    assert codec_section.compression_share(0.0, 0.0, 700.0) == 0.0


def test_median_times_reports_wall_and_cpu():
    from benchmarks.common import median_times
    wall, cpu = median_times(lambda: sum(i * i for i in range(20000)), repeats=3)
    assert wall > 0 and cpu > 0


def test_100m_shapes_are_about_100m_parameters():
    n = sum(math.prod(s) for s in codec_section.shapes_100m().values())
    assert 90e6 < n < 130e6


# -------------------------------------------------------------- validator
def test_per_peer_cost_separates_shared_work():
    shared, per_peer = 120.0, 250.0
    t_one, t_four = shared + per_peer, shared + 4 * per_peer
    got_per_peer, got_shared = validator.per_peer_cost(t_four, t_one, 4)
    assert got_per_peer == pytest.approx(per_peer)
    assert got_shared == pytest.approx(shared)
    # the issue's definition: (T(S) - shared) / S / forward
    assert (t_four - got_shared) / 4 / 50.0 == pytest.approx(got_per_peer / 50.0)
    with pytest.raises(ValueError):
        validator.per_peer_cost(t_four, t_one, 1)


def test_peak_rss_of_this_process_and_of_a_missing_one():
    assert proc_peak_rss_mb(os.getpid()) > 10
    assert proc_peak_rss_mb(2 ** 31 - 1) is None


# ----------------------------------------------------------------- gather
def test_scaling_exponent_is_the_log_log_slope():
    linear = [{"peers": k, "seconds": 0.02 * k} for k in (8, 32, 128)]
    quadratic = [{"peers": k, "seconds": 1e-4 * k * k} for k in (8, 32, 128)]
    assert gather.scaling_exponent(linear) == pytest.approx(1.0)
    assert gather.scaling_exponent(quadratic) == pytest.approx(2.0)
    assert gather.scaling_exponent([{"peers": 8, "seconds": 1.0}, {"peers": 32, "seconds": 1.0}]) == pytest.approx(0)
    assert gather.scaling_exponent(linear[:1]) is None


def test_gather_summary_adds_per_peer_time_and_decode_share():
    rows = gather.summarise([{"peers": 8, "seconds": 0.2}, {"peers": 32, "seconds": 0.64}], decode_ms=5.0)
    assert rows[0]["seconds_per_peer"] == pytest.approx(0.025)
    assert rows[1]["decode_share"] == pytest.approx(0.005 * 32 / 0.64)
    assert "| 32 | 0.64 | 20.0 | 25% |" in gather.markdown(
        {"gather": rows, "scaling_exponent": 0.85, "payload_bytes": 100, "decode_ms": 5.0})
    hostile = [{"hostile": 64, "kind": "drip", "priority": True, "honest_seconds": 0.96, "seconds": 8.0,
                "honest_ok": True, "ratio": 1.12}]
    assert "| 64 | drip | yes | 0.96 | 8.00 | yes | 1.12 |" in gather.markdown(
        {"gather": rows, "scaling_exponent": 0.85, "payload_bytes": 100, "decode_ms": 5.0, "hostile": hostile})


# ------------------------------------------------------------ convergence
def _curves(a, a32, b, adamw: dict[float, list]):
    out = {"demo": a, "demo_fp32_values": a32, "uncompressed": b}
    out.update({convergence.adamw_key(lr): c for lr, c in adamw.items()})
    return out


def test_convergence_summary_ratios_and_adamw_pick():
    curves = _curves([5.5, 4.0, 3.0], [5.5, 4.1, 3.1], [5.5, 4.2, 3.3],
                     {1e-3: [5.5, 4.5, 3.2], 2e-3: [5.5, 4.0, 2.9], 4e-3: [5.5, None, None]})
    s = convergence.summarise(curves, (1e-3, 2e-3, 4e-3), windows=2, peers=4, tokens_per_window=8192)
    assert s["adamw_lr"] == 2e-3 and s["adamw"] == 2.9
    assert s["ratio"] == pytest.approx(3.0 / 2.9)
    assert s["ratio_vs_uncompressed"] == pytest.approx(3.0 / 3.3)
    assert s["ratio_4bit_vs_fp32_values"] == pytest.approx(3.0 / 3.1)
    assert s["adamw_sweep"] == {"0.001": 3.2, "0.002": 2.9, "0.004": None}  # diverged: null, never picked
    assert s["initial"] == 5.5
    for key in ("demo", "uncompressed", "adamw", "ratio", "windows"):
        assert key in s
    assert "ratio (a)/(c) = 1.0345" in convergence.markdown(s)


def test_convergence_ratio_is_none_when_demo_diverges():
    curves = _curves([5.5, math.nan], [5.5, 4.0], [5.5, 4.0], {2e-3: [5.5, 4.0]})
    curves["demo"] = [finite_or_none(x) for x in curves["demo"]]
    s = convergence.summarise(curves, (2e-3,), 1, 2, 4096)
    assert s["demo"] is None and s["ratio"] is None
    assert "diverged" in convergence.markdown(s)


def test_tail_mean():
    assert convergence.tail_mean([9.0, 1.0, 2.0, 3.0], n=3) == pytest.approx(2.0)
    assert convergence.tail_mean([1.0, None], n=2) == math.inf


# ---------------------------------------------------------------- targets
def _result(**over):
    res = {
        "codec": {"within_bound_pct": 6.3, "model_100m": {"within_bound_pct": 5.4}, "vs_templar_2_5_bytes": 1.56,
                  "compression_share_of_window": 0.07},
        "validator": {"eval_forward_units_per_peer": 4.1},
        "gather": {"scaling_exponent": 1.0, "hostile_worst_ratio": 1.5, "hostile_honest_ok": 1.0,
                   "hostile_look_observed": 1.0},
        "convergence": {"ratio": 1.05, "ratio_4bit_vs_fp32_values": 1.001},
        "data": {"rss_growth_mb": 32.0, "remote_vs_local": 0.95, "cache_peak_share": 1.0, "remote_rss_growth_mb": 33.0},
        "incentives": {"wrong_data_share": 0.01, "replay_share": 0.0, "mix_share": 0.02, "mixer_majority_share": 0.0,
                       "gamer_share": 0.0, "part_time_share": 0.0, "good_share": 0.95, "honest_max_min_ratio": 1.5,
                       "diligent_over_honest": 2.5, "diligent_over_honest_30w": 1.49,
                       "split_over_concentrated": 1.0, "poc_honest_pass_rate": 0.95},
        "training": {"loss_ratio_vs_ddp": 1.05, "bytes_ratio_vs_ddp": 999.0, "miner_utilisation": 0.85},
        "scale": {"fsdp_rel_err": 1e-5, "fsdp_index_agreement": 0.998, "miner_vs_plain_torch": 0.9,
                  "rank_rss_ratio": 0.66},
    }
    res.update(over)
    return res


def test_targets_verdicts_on_boundaries():
    rows = {r["target"]: r for r in targets.check_targets(_result())}
    assert len(rows) == len(targets.TARGETS)
    met = {name: r["met"] for name, r in rows.items()}
    assert met["validator cost per peer in forward units"] is False
    assert met["gather time linear or better in K (log-log slope)"] is True       # exactly 1: linear
    hostile = [name for name in met if name.startswith("gather.hostile")]
    assert len(hostile) == 3 and all(met[name] for name in hostile)              # 1.5 exactly; all honest ok
    worse = targets.check_targets(_result(gather={"hostile_worst_ratio": 1.51, "hostile_honest_ok": 0.0,
                                                  "hostile_look_observed": 31 / 32}))
    assert [r["met"] for r in worse if r["target"].startswith("gather.hostile")] == [False, False, False]
    assert met["convergence (a)/(c) within 5% of AdamW"] is True                  # exactly 1.05
    assert met["4-bit values converge no worse than float32 values: (a)/(a')"] is False
    assert met["bytes per kept within 15% of the bound (~100 M shapes)"] is True
    assert met["miner peak RSS flat across corpus sizes (growth in MB)"] is True          # exactly 32
    assert met["data: miner tokens/s from the dataset bucket ÷ from local shards"] is True     # exactly 0.95
    assert met["data: chunk cache peak on disk ÷ --data.cache_mb"] is True                     # exactly 1
    assert met["data: remote miner peak RSS, 2 GiB corpus − 2-shard corpus (MB)"] is False     # 33 > 32
    assert rows["bytes per kept ≥ 1.5× smaller than 2.5 B"]["threshold"] == ">= 1.5"
    incentive = {name: m for name, m in met.items() if name.startswith("incentives:")}
    assert [name for name, m in incentive.items() if not m] == [                               # the rest exactly at
        "incentives: share of the best-paid mixer",                                            # their thresholds
        "incentives: 2x compute / honest, 30 windows (median seed), at least"]
    assert met["training: network loss / DDP AdamW at equal tokens"] is True                   # exactly 1.05
    assert met["training: bf16 all-reduce bytes / bytes one peer sends per window"] is False   # 999 < 1000
    assert met["training: miner utilisation in the local network (least-utilised miner)"] is True  # exactly 0.85
    assert met["scale: 2-rank pseudo-gradient, relative L2 to one process"] is True                 # exactly 1e-5
    assert met["scale: 2-rank compressed update, kept indices in common with one process"] is False  # 0.998
    assert met["scale: miner inner loop tokens/s / plain torch AdamW loop"] is True                 # exactly 0.9
    assert met["scale: peak RSS per rank, 2 ranks / 1 process (125m, full mode)"] is False          # 0.66


def test_targets_of_sections_not_run_or_failed():
    rows = targets.check_targets(_result(validator={"error": "boom"}, convergence=None))
    missing = [r for r in rows if r["met"] is None]
    assert {r["target"] for r in missing} == {
        "validator cost per peer in forward units", "convergence (a)/(c) within 5% of AdamW",
        "4-bit values converge no worse than float32 values: (a)/(a')"}
    assert "not run" in targets.markdown(rows)


def test_markdown_renders_sections_errors_and_targets():
    result = {"quick": True, "machine": {"cpus": 2},
              "codec": {"bytes_per_kept": 1.6, "model_100m": {"bytes_per_kept": 1.61}},
              "validator": {"error": "RuntimeError: x"}}
    result["targets"] = targets.check_targets(result)
    text = markdown(result)
    assert "### codec" in text and "| model_100m.bytes_per_kept | 1.61 |" in text
    assert "failed: RuntimeError: x" in text
    assert "### targets" in text
    assert "machine" not in text.split("### targets")[0]
    assert generic_markdown({"curve": [1, 2, 3]}).count("\n") == 1  # long lists stay in the JSON
    assert all(callable(m.run) for m in MODULES.values())


# ------------------------------------------------------------------- data
def test_data_section_growth_and_generated_corpus(tmp_path):
    from benchmarks import data
    rows = [{"corpus_mb": 200.0, "rss_mb": 650.0}, {"corpus_mb": 20.0, "rss_mb": 640.5}]
    assert data.rss_growth(rows) == pytest.approx(9.5)
    written = data.generate_corpus(tmp_path / "a", 0.3, seed=1)
    again = data.generate_corpus(tmp_path / "b", 0.3, seed=1)
    files = sorted((tmp_path / "a").iterdir())
    assert written == again and abs(written - 300_000) < 1000
    assert [f.read_bytes() for f in files] == [f.read_bytes() for f in sorted((tmp_path / "b").iterdir())]
    text = files[0].read_text()
    assert text.count("\n") > 100 and len(set(text.split())) > 500   # lines of many distinct words
    assert "data" in SECTIONS and list(SECTIONS)[-1] == "convergence"


def test_remote_data_figures_by_hand(tmp_path):
    """The bucket-against-local figures from the runs' numbers, and the generated random corpus is a valid
    shard folder (opening it checks every hash and chunk digest)."""
    from benchmarks import data_remote
    from dso.data.shards import open_shards
    data_remote.write_random_shards(tmp_path / "c", 2, 5000)
    shards = open_shards(tmp_path / "c")
    assert [a.shape[0] for a in shards.arrays] == [5000, 5000] and shards.manifest.chunk_bytes == 1 << 16
    window = {"seconds": 2.0, "data_wait_s": 0.1, "tokens": 100, "fetched_mb": 30.0, "chunks": 500}
    run = {"tokens_per_s": 0.0, "first_window_s": 3.0, "windows": [window, window], "rss_mb": 700.0, "cpu_s": 9.0,
           "shards": 32, "cache_peak_mb": 90.0, "cache_accounted_peak_mb": 89.0, "outages": 0, "held_peak_mb": 30.0}
    runs = {"local": [{**run, "tokens_per_s": 1000.0}, {**run, "tokens_per_s": 1200.0}],
            "remote": [{**run, "tokens_per_s": 1050.0},
                       {**run, "tokens_per_s": 1040.0, "rss_mb": 705.0, "held_peak_mb": 34.0}]}
    out = data_remote.summarise(runs, {**run, "rss_mb": 690.0, "shards": 2}, data_remote.FULL, "seaweedfs",
                                2 ** 31, 1.0, 2.0)
    assert out["remote_vs_local"] == pytest.approx((1050 / 1000 + 1040 / 1200) / 2, abs=1e-4)   # median of 2
    assert out["remote_vs_local_means"] == pytest.approx(1045 / 1100, abs=1e-4)
    assert out["cache_peak_share"] == pytest.approx(90 / 96, abs=1e-3) and out["corpus_token_gb"] == 2.0
    assert out["remote_rss_growth_mb"] == 15.0 and out["per_window"]["chunks"] == 500
    assert out["held_peak_mb"] == 34.0
    assert "bucket ÷ local shards" in data_remote.markdown(out)
# ------------------------------------------------------------- extra compute
def test_extra_compute_figures_by_hand():
    rows = [{"scores": {1: 0.2, 2: 0.4, 3: 0.5}, "val_loss": 7.0},   # honest mean 0.3: diligent 5/3
            {"scores": {1: 0.1, 2: 0.3, 3: 0.1}, "val_loss": 6.5}]   # honest mean 0.2: diligent 1/2
    assert extra_compute.diligent_ratio(rows[0]["scores"], [1, 2], 3) == pytest.approx(5 / 3)
    assert math.isnan(extra_compute.diligent_ratio({1: -0.1, 2: 0.1, 3: 0.5}, [1, 2], 3))  # no positive mean
    got = extra_compute.summary(rows, honest=[1, 2], diligent=3)
    assert got["ratio_of_sums"] == pytest.approx(0.6 / 0.5)
    assert got["per_window"] == [1.667, 0.5] and got["windows_won"] == 1 and got["final_val_loss"] == 6.5


# ------------------------------------------------------------- incentives
def test_incentive_figures_by_hand():
    assert incentives.max_min_ratio([0.1, 0.2, 0.4]) == pytest.approx(4.0)
    assert incentives.max_min_ratio([0.0, 0.3]) == pytest.approx(0.3 / incentives.ZERO_SHARE)  # nothing: huge
    assert incentives.max_min_ratio([0.0, 0.0]) == pytest.approx(1 / incentives.ZERO_SHARE)   # nobody paid: worst
    assert incentives.windows_to_lose([0.3, 0.2, 0.02, 0.005, 0.0], switch=1) == 3   # windows 1, 2 still ≥ 1 %
    assert incentives.windows_to_lose([0.3, 0.005], switch=1) == 1 and incentives.windows_to_lose([0.3, 0.2], 1) is None
    assert incentives.over_mean(0.3, [0.1, 0.2]) == pytest.approx(2.0)
    rows = [{1: 0.0, 2: 0.0, 3: 0.0}, {1: 0.5, 2: 0.5, 3: 0.0}, {1: 0.1, 2: 0.3, 3: 0.6}]
    assert incentives.share_over(rows, [3]) == pytest.approx(0.3)                 # of what was posted: 2 rows
    assert incentives.share_over(rows[:1], [3]) == 0.0
    got = incentives.curve_figures(rows[2], honest=[1, 2], diligent=3)
    assert got == pytest.approx({"honest_max_min_ratio": 3.0, "diligent_over_honest": 3.0,
                                 "split_over_concentrated": 0.4 / 0.6})
    records = [{"poc_statistics": {"1": 3.0, "2": 0.2, "9": 5.0}}, {"poc_statistics": {"2": 1.5}}]
    assert incentives.pass_rate(records, [1, 2], 1.5) == (2, 3)


def test_incentive_summary_takes_the_worst_of_each_family_and_medians_of_the_curve():
    def seed(wrong: float, ratio: float) -> dict:
        shares = {b: 0.0 for family in incentives.FAMILIES.values() for b in family}
        shares["fixedbatch"], shares["parttime2"] = wrong, 0.004
        return {"shares": shares, "good_share": 1 - wrong, "honest_max_min_ratio": ratio, "diligent_over_honest": 2.0,
                "diligent_over_honest_30w": ratio, "split_over_concentrated": 0.9, "poc_passed": 9,
                "poc_evaluated": 10}
    s = incentives.summarise([seed(0.02, 1.2), seed(0.0, 1.4), seed(0.01, 3.0)], [0.0, 0.03])
    assert s["wrong_data_share"] == pytest.approx(0.01) and s["replay_share"] == 0.0
    assert s["gamer_share"] == pytest.approx(0.004) and s["part_time_share"] == pytest.approx(0.004)
    assert s["mixer_majority_share"] == pytest.approx(0.015)
    assert s["honest_max_min_ratio"] == pytest.approx(1.4) and s["diligent_over_honest_30w"] == pytest.approx(1.4)
    assert s["poc_honest_pass_rate"] == pytest.approx(0.9)
    s.update(seeds=3, model="tiny", inner_steps=2, windows=6, majority_windows=4)
    assert "| fixedbatch | 0.0100 | 0.0200 |" in incentives.markdown(s)


# ---------------------------------------------------------------- privacy
def test_privacy_markdown_and_epsilon():
    assert privacy.epsilon_for(1.0, 1, 1e-6) == pytest.approx(11.855, abs=1e-3)
    row = {"z": 0.01, "epsilon": 4e6, "demo_update": 0.38, "sketch4096_update": 0.48, "sketch4096_in_sketch": 0.26}
    result = {"placement": {"rounds": 2, "parameters": 1000, "clip": 1.0, "rows": [row]},
              "training": {"peers": 2, "windows": 3, "delta": 1e-6, "initial": 5.5, "z": {"no_dp": None},
                           "epsilon": {"no_dp": None}, "final": {"no_dp": 5.0}, "final_bits_per_byte": {"no_dp": 7.2}},
              "peers_to_average_eps8_noise_down_to_z": 6.4e5}
    text = privacy.markdown(result)
    assert "| 0.01 | 4e+06 | +0.3800 | +0.4800 | +0.2600 |" in text and "| no_dp | — | — | 5.0000 | 7.2000 |" in text


# --------------------------------------------------------------- training
def test_bits_per_byte():
    from dso.training.train import bits_per_byte
    assert bits_per_byte(math.log(2), 10, 10) == pytest.approx(1.0)
    assert bits_per_byte(2.5, 1, 1) == pytest.approx(3.6067, abs=1e-4)  # the issue's 2.5 nats/byte ≈ 3.6 bpb
    assert bits_per_byte(1.0, 250, 1000) == pytest.approx(0.25 / math.log(2))  # 4 bytes per token
    assert training.bits_of(2.0, 0.5) == 1.0 and training.bits_of(math.nan) is None


def test_bytes_ratio_reads_as_times_fewer():
    assert training.allreduce_bytes(1_000_000, 3) == 6_000_000
    assert training.bytes_ratio(1_000_000, 3, 6_000) == pytest.approx(1000.0)
    assert training.bytes_ratio(1_000_000, 3, 0) is None


def test_miner_utilisation_from_a_report(tmp_path):
    import json
    assert training.miner_utilisation(None) is None
    assert training.miner_utilisation(str(tmp_path / "missing.json")) is None
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"miner_utilisation": 0.91}))
    assert training.miner_utilisation(str(path)) == 0.91
    path.write_text(json.dumps({"miner_utilisation": {"3": 0.95, "4": 0.8, "5": "x"}}))
    assert training.miner_utilisation(path) == 0.8  # the least-utilised miner
    path.write_text("not json")
    assert training.miner_utilisation(str(path)) is None


BITS_PER_NAT = 1 / math.log(2)


def _run(curve, tokens=None, lr=None, nbytes=0, per_nat=BITS_PER_NAT):
    return {"val_loss": curve, "tokens": tokens or list(range(len(curve))), "update_bytes": nbytes,
            "cpu_seconds": 1.0, "spec": {"lr": lr}, "bits_per_nat": per_nat}


def test_training_summary_picks_the_best_ddp_and_reports_bits():
    runs = {"network": _run([5.5, 3.0, 2.1], [0, 10, 20], nbytes=40_000, per_nat=0.4),
            "paper": _run([5.5, 4.0, 3.0]),
            "ddp_lr0.001": _run([5.5, 3.5, 2.2], lr=1e-3), "ddp_lr0.002": _run([5.5, 3.0, 2.0], lr=2e-3),
            "ddp_lr0.004": _run([5.5, None, None], lr=4e-3)}
    s = training.summarise(runs, {"peers": 4, "windows": 2, "steps": 3}, parameters=1_000_000, payload_bytes=5_000,
                           utilisation=0.9, utilisation_source="r.json")
    assert s["ddp_lr"] == 2e-3 and s["ddp_nats"] == 2.0
    assert s["loss_ratio_vs_ddp"] == pytest.approx(2.1 / 2.0)
    assert s["loss_ratio_vs_ddp_tail"] == pytest.approx((5.5 + 3.0 + 2.1) / (5.5 + 3.0 + 2.0))
    assert s["network_bits_per_byte"] == pytest.approx(2.1 * 0.4)   # the validation batch's bytes per token
    assert s["bytes_ratio_vs_ddp"] == pytest.approx(6_000_000 / 5_000)
    assert s["ddp_sweep"]["0.004"] is None and s["tokens"] == 20 and s["miner_utilisation"] == 0.9
    text = training.markdown({**s, "codec_energy": {"columns": ["4 bit"], "rows": {"pseudo dct top-32": [0.05]}}})
    assert "loss_ratio_vs_ddp = 1.0500" in text and "| pseudo dct top-32 | 0.0500 |" in text


def test_a_sweep_writes_its_table_beside_its_curves_and_divides_by_the_best_ddp(tmp_path):
    runs = {"net": {**_run([6.0, 5.5, 5.25], nbytes=46_660), "spec": {"kind": "network"}},
            "ddp_lr0.002": {**_run([6.0, 5.2, 5.0]), "spec": {"kind": "ddp"}},
            "ddp_lr0.004": {**_run([6.0, 5.3, None]), "spec": {"kind": "ddp"}}}
    training.write_sweep(runs, tmp_path / "sweep.json")
    table = (tmp_path / "sweep.md").read_text()
    assert "| net | 5.250 | 7.574 | 5.583 | 1.050 | 46660 | 1 |" in table  # 5.25 / ln 2; mean of the 3; ÷ 5.0
    assert "| ddp_lr0.004 | — | — | — | — | 0 | 1 |" in table
    assert json.loads((tmp_path / "sweep.json").read_text())["net"]["val_loss"] == [6.0, 5.5, 5.25]
    assert (tmp_path / "sweep.png").stat().st_size > 0


def test_parse_variant():
    name, spec = training.parse_variant("sgd2:outer.rule=sgd,outer.lr=2,overlap=1", 4, 8, 3)
    assert name == "sgd2" and spec["set"] == {"outer.rule": "sgd", "outer.lr": "2"} and spec["overlap"] == 1
    assert (spec["peers"], spec["windows"], spec["steps"]) == (4, 8, 3)
    name, spec = training.parse_variant("ddp:0.002", 4, 8, 3)
    assert name == "ddp_lr0.002" and spec["kind"] == "ddp" and spec["lr"] == 0.002
    name, spec = training.parse_variant("ddp:0.004,tokenizer=bytes,model.vocab_size=256,windows=6", 4, 8, 3)
    assert name == "ddp_lr0.004" and spec["lr"] == 0.004 and spec["windows"] == 6
    assert spec["set"] == {"tokenizer": "bytes", "model.vocab_size": "256"}
    name, spec = training.parse_variant("paper", 4, 8, 3)
    assert (spec["windows"], spec["steps"]) == (24, 1) and spec["set"]["inner.mode"] == "gradient"
    assert spec["set"]["outer.rule"] == "signed" and spec["set"]["dct"] is True  # configs/gauntlet.toml


def test_training_quick_mode_runs_the_real_loop(monkeypatch, tmp_path):
    """The section's quick mode end to end (tiny model, in this process): real losses and byte counts."""
    report = tmp_path / "report.json"
    report.write_text('{"miner_utilisation": {"1": 0.9, "2": 0.87}}')
    monkeypatch.setenv(training.UTILISATION_ENV, str(report))
    out = training.run(quick=True)
    assert out["tiny_model"] and (out["peers"], out["windows"], out["inner_steps"]) == (2, 2, 2)
    assert out["tokens"] == 2 * 2 * 2 * 8 * 32                     # peers × windows × steps × batch × seq_len
    assert out["initial_nats"] == pytest.approx(math.log(256), abs=0.05)   # a fresh byte-level model
    assert out["bits_per_nat"] == pytest.approx(1 / math.log(2))            # one token per byte
    for key in ("network_nats", "ddp_nats", "paper_nats"):
        assert out[key] < out["initial_nats"]                                # every run learned something
    assert out["loss_ratio_vs_ddp"] == pytest.approx(out["network_nats"] / out["ddp_nats"])
    assert out["allreduce_bytes_per_window"] == 2 * 2 * out["parameters"]
    assert out["bytes_ratio_vs_ddp"] == pytest.approx(out["allreduce_bytes_per_window"] / out["payload_bytes"])
    assert out["miner_utilisation"] == 0.87 and out["miner_utilisation_source"] == str(report)
    assert len(out["curves"]["network"]) == 3 and len(out["curves"]["paper"]) == 5
    assert set(out["codec_energy"]["rows"]) >= {"pseudo dct top-8", "gradient raw top-4"}


def test_energy_share_is_the_energy_of_the_kept_coefficients():
    """First round, float32 values: the share is the top-k's share of the chunk's (DCT) energy."""
    codec = DeMoCodec({"w": (8, 8)}, chunk=8, topk=4, value_bits=32)
    g = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
    coeffs = codec.plans["w"].encode(g).reshape(-1)
    want = float(coeffs.square().topk(4).values.sum() / coeffs.square().sum())
    assert energy.sent_shares([{"w": g}], codec, beta=0.9)[0] == pytest.approx(want, rel=1e-5)
    everything = DeMoCodec({"w": (8, 8)}, chunk=8, topk=64, value_bits=32)
    assert energy.sent_shares([{"w": g}] * 3, everything, beta=0.9) == pytest.approx([1.0] * 3, abs=1e-6)
