"""The project's targets, checked against a benchmark result (pure: result dict in, verdicts out)."""
from __future__ import annotations

# (name, section, path to the value, comparison, threshold)
TARGETS = [
    ("bytes per kept within 15% of the bound (default model)", "codec", ("within_bound_pct",), "<=", 15.0),
    ("bytes per kept within 15% of the bound (~100 M shapes)", "codec", ("model_100m", "within_bound_pct"), "<=", 15.0),
    ("bytes per kept ≥ 1.5× smaller than 2.5 B", "codec", ("vs_templar_2_5_bytes",), ">=", 1.5),
    ("4-bit values converge no worse than float32 values: (a)/(a')", "convergence",
     ("ratio_4bit_vs_fp32_values",), "<=", 1.0),
    # a forward unit: one pass over eval_sequences sequences; the proof of computation's sample of each peer's trained
    # sequences, at θ' and at the consensus step, doubles what the sign test cost (docs/decisions/0001)
    ("validator cost per peer in forward units", "validator", ("eval_forward_units_per_peer",), "<=", 4.0),
    ("gather time linear or better in K (log-log slope)", "gather", ("scaling_exponent",), "<=", 1.0),
    ("gather.hostile: 32 honest peers beside 16/64 stalled or drip peers, time / clean time", "gather",
     ("hostile_worst_ratio",), "<=", 1.5),
    ("gather.hostile: every honest peer gathered, results unchanged (1 = yes)", "gather",
     ("hostile_honest_ok",), ">=", 1.0),
    # a look that cannot be blinded
    ("gather.hostile: every honest upload's first sight observed beside 64 tarpits, every window (share)",
     "gather", ("hostile_look_observed",), ">=", 1.0),
    ("codec encode + decode share of a miner's window", "codec", ("compression_share_of_window",), "<", 0.10),
    ("convergence (a)/(c) within 5% of AdamW", "convergence", ("ratio",), "<=", 1.05),
    # ten times the corpus may not cost a miner more than a few MB of peak RSS
    ("miner peak RSS flat across corpus sizes (growth in MB)", "data", ("rss_growth_mb",), "<=", 32.0),
    # the corpus served from a dataset bucket
    ("data: miner tokens/s from the dataset bucket ÷ from local shards", "data", ("remote_vs_local",), ">=", 0.95),
    ("data: chunk cache peak on disk ÷ --data.cache_mb", "data", ("cache_peak_share",), "<=", 1.0),
    ("data: remote miner peak RSS, 2 GiB corpus − 2-shard corpus (MB)", "data", ("remote_rss_growth_mb",), "<=",
     32.0),
    # only work is paid, in proportion to it
    ("incentives: share of the best-paid miner on other data", "incentives", ("wrong_data_share",), "<=", 0.01),
    ("incentives: share of the best-paid replayer", "incentives", ("replay_share",), "<=", 0.01),
    ("incentives: share of the best-paid mixer", "incentives", ("mix_share",), "<=", 0.01),
    ("incentives: share of five mixers beside three honest miners", "incentives", ("mixer_majority_share",), "<=",
     0.01),
    ("incentives: share of a miner that works one window in two", "incentives", ("gamer_share",), "<=", 0.01),
    ("incentives: share of the best-paid part-time miner (one window in 2, 3, 5)", "incentives",
     ("part_time_share",), "<=", 0.01),
    ("incentives: honest and diligent share of all the weight", "incentives", ("good_share",), ">=", 0.95),
    ("incentives: identical honest miners, largest / smallest share (median seed)", "incentives",
     ("honest_max_min_ratio",), "<=", 1.5),
    ("incentives: 2x compute / honest, 12 windows (median seed), at least", "incentives", ("diligent_over_honest",),
     ">=", 1.5),
    ("incentives: 2x compute / honest, 12 windows (median seed), at most", "incentives", ("diligent_over_honest",),
     "<=", 2.5),
    ("incentives: 2x compute / honest, 30 windows (median seed), at least", "incentives",
     ("diligent_over_honest_30w",), ">=", 1.5),
    ("incentives: 2x compute / honest, 30 windows (median seed), at most", "incentives",
     ("diligent_over_honest_30w",), "<=", 2.5),
    ("incentives: compute split over two uids / kept on one", "incentives", ("split_over_concentrated",), "<=", 1.0),
    ("incentives: honest evaluations whose proof of computation passes", "incentives", ("poc_honest_pass_rate",),
     ">=", 0.95),
    # the network trains like a real one
    ("training: network loss / DDP AdamW at equal tokens", "training", ("loss_ratio_vs_ddp",), "<=", 1.05),
    ("training: bf16 all-reduce bytes / bytes one peer sends per window", "training", ("bytes_ratio_vs_ddp",),
     ">=", 1000.0),
    ("training: miner utilisation in the local network (least-utilised miner)", "training", ("miner_utilisation",),
     ">=", 0.85),
    # one miner on several ranks (FSDP2)
    ("scale: 2-rank pseudo-gradient, relative L2 to one process", "scale", ("fsdp_rel_err",), "<=", 1e-5),
    ("scale: 2-rank compressed update, kept indices in common with one process", "scale",
     ("fsdp_index_agreement",), ">=", 0.999),
    ("scale: miner inner loop tokens/s / plain torch AdamW loop", "scale", ("miner_vs_plain_torch",), ">=", 0.9),
    ("scale: peak RSS per rank, 2 ranks / 1 process (125m, full mode)", "scale", ("rank_rss_ratio",), "<=", 0.65),
]


def _lookup(result: dict, section: str, path: tuple[str, ...]):
    value = result.get(section)
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def check_targets(result: dict) -> list[dict]:
    """One row per target: value (None when its section was not run or failed) and met (True/False/None)."""
    rows = []
    for name, section, path, op, threshold in TARGETS:
        value = _lookup(result, section, path)
        met = None if value is None else {"<=": value <= threshold, "<": value < threshold,
                                          ">=": value >= threshold}[op]
        rows.append({"target": name, "value": value, "threshold": f"{op} {threshold:g}", "met": met})
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| target | value | threshold | met |", "|---|---:|---:|:---:|"]
    for r in rows:
        value = "—" if r["value"] is None else f"{r['value']:.4g}"
        met = {True: "yes", False: "**no**", None: "not run"}[r["met"]]
        lines.append(f"| {r['target']} | {value} | {r['threshold']} | {met} |")
    return "\n".join(lines)
