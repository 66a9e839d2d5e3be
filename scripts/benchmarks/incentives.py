"""Incentives section: is only work paid, and is pay in proportion to it?

The in-process simulator (sim/simulator.py, the validator's real window engine) runs, over ``seeds`` seeds
(``hp.seed`` changes the model's initialisation, the data assignment, the validator's secret and the chain
randomness):

* the **zoo**: four honest peers, one diligent peer (twice the sequences per window) and every way to be paid
  without the work — training on data other than the assignment (``wrongdata``, ``fixedbatch``, ``othertext``),
  replays of earlier updates and aggregates (``selfreplay``, ``stalecopy``, ``replayer``, ``oldreplayer``), mixes of
  other peers' updates (``mixer``, ``mixall``, ``noisymix``, ``scaledmix``) and part-time work with replays or zeros in
  between (``parttime2``, ``parttime3``, ``parttime5``, ``parttime2z``) — for ``windows`` windows;
* the **mixer majority**: ``MAJORITY["honest"]`` honest peers beside more mixers than that.

Figures per seed, then over seeds:

* ``<behaviour>`` shares: its part of all the weight posted over the first 20 windows and over all of them (the
  larger of the two);
* ``honest_max_min_ratio``: the largest over the smallest honest share in the row of window 12 and of the last
  window (the larger); ``diligent_over_honest`` (window 12) and ``diligent_over_honest_30w`` (the last window):
  the diligent share over the honest mean; ``split_over_concentrated``: the diligent peer's compute split over two
  honest uids (two honest shares) over its one share, in the last window;
* ``poc_honest_pass_rate``: the share of the honest and diligent evaluations whose proof-of-computation statistic
  reaches ``poc_threshold``.

The keys are the worst adversary of each family (mean over seeds), and the medians over seeds of the pay curve
(scripts/benchmarks/targets.py holds the targets).  ``turncoat`` (tiny model): the best-paid honest peer turns to
noise at window ``switch``; ``windows_to_lose`` = windows it is still paid at least ``LOST`` of the weight.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import as_completed
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.path.insert(1, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import worker_pool  # noqa: E402

FAMILIES = {
    "wrong_data": ("wrongdata", "fixedbatch", "othertext"),
    "replay": ("selfreplay", "stalecopy", "replayer", "oldreplayer"),
    "mix": ("mixer", "mixall", "noisymix", "scaledmix"),
    "part_time": ("parttime2", "parttime3", "parttime5", "parttime2z"),
}
HONEST = 4
ZOO_ROLES = ["honest"] * HONEST + ["diligent"] + [b for family in FAMILIES.values() for b in family]
MAJORITY = {"honest": 3, "mixers": ("mixall", "mixall", "noisymix", "scaledmix", "mixer")}
FULL = {"seeds": 10, "windows": 30, "majority_windows": 20, "model": "default", "inner_steps": 2}
QUICK = {"seeds": 1, "windows": 6, "majority_windows": 4, "model": "tiny", "inner_steps": 2}
TURNCOAT = {"seeds": 10, "windows": 20, "honest": 4, "switch": 10}
TURNCOAT_QUICK = {"seeds": 1, "windows": 6, "honest": 3, "switch": 3}
EARLY = 12   # the window of the short pay-curve figures (the local network's default run has 12 windows)
SPAN = 20    # adversary shares are read over the first SPAN windows and over the whole run
LOST = 0.01  # a turncoat has lost its weight once its share is below this
ZERO_SHARE = 1e-6


# ---------------------------------------------------------------- formulas
def share_over(rows: list[dict[int, float]], uids: list[int]) -> float:
    """The part of all the weight posted in ``rows`` that went to ``uids`` (0 when nothing was posted)."""
    total = sum(sum(row.values()) for row in rows)
    return sum(row.get(u, 0.0) for row in rows for u in uids) / total if total > 0 else 0.0


def max_min_ratio(shares: list[float]) -> float:
    """Largest over smallest share (a zero share counts as ZERO_SHARE; nobody paid counts as the worst)."""
    if not max(shares) > 0:
        return 1.0 / ZERO_SHARE
    return max(shares) / max(min(shares), ZERO_SHARE)


def over_mean(share: float, others: list[float]) -> float:
    """``share`` over the mean of ``others`` (a zero mean counts as ZERO_SHARE)."""
    return share / max(sum(others) / len(others), ZERO_SHARE)


def curve_figures(row: dict[int, float], honest: list[int], diligent: int) -> dict[str, float]:
    """The pay curve in one posted row: honest spread, diligent over honest, split over concentrated."""
    shares = [row.get(u, 0.0) for u in honest]
    mean = sum(shares) / len(shares)
    return {"honest_max_min_ratio": max_min_ratio(shares),
            "diligent_over_honest": over_mean(row.get(diligent, 0.0), shares),
            "split_over_concentrated": 2 * mean / max(row.get(diligent, 0.0), ZERO_SHARE)}


def pass_rate(records: list[dict], uids: list[int], threshold: float) -> tuple[int, int]:
    """(evaluations of ``uids`` whose statistic reached ``threshold``, evaluations of ``uids``)."""
    stats = [z for r in records for u, z in r["poc_statistics"].items() if int(u) in uids]
    return sum(z >= threshold for z in stats), len(stats)


# ------------------------------------------------------------------ runs
def _hparams(model: str, seed: int):
    from dso.config.schema import HParams, ModelConfig
    hp = HParams(seed=seed)
    if model == "tiny":
        hp.model = ModelConfig(d_model=32, n_layers=1, n_heads=2, ffn_hidden=64, seq_len=32)
        hp.batch_size, hp.assigned_sequences, hp.micro_batch, hp.chunk, hp.topk = 8, 64, 8, 16, 8
    return hp


def run_network(seed: int, roles: list[str], windows: int, model: str, inner_steps: int) -> dict:
    """In a worker: one simulated run; the per-window records (weights, statistics, rejections)."""
    from benchmarks.common import default_dataset, setup_worker
    setup_worker()
    from sim.simulator import SimNet

    hp = _hparams(model, seed)
    net = SimNet(hp, default_dataset(hp), roles, inner_steps=inner_steps)
    records = [r.to_dict() for r in net.run(windows)]
    return {"seed": seed, "roles": roles, "threshold": hp.poc_threshold, "records": records,
            "seconds": sum(r["seconds"] for r in records), "val_loss": records[-1]["val_loss"]}


def weights_of(run: dict) -> list[dict[int, float]]:
    return [{int(u): w for u, w in r["weights"].items()} for r in run["records"]]


def uids_of(roles: list[str], names) -> list[int]:
    return [i + 1 for i, role in enumerate(roles) if role in names]


def zoo_figures(run: dict) -> dict:
    """Every figure of one zoo run."""
    roles, rows = run["roles"], weights_of(run)
    honest, diligent = uids_of(roles, ("honest",)), uids_of(roles, ("diligent",))[0]
    shares = {b: max(share_over(rows[:SPAN], uids_of(roles, (b,))), share_over(rows, uids_of(roles, (b,))))
              for family in FAMILIES.values() for b in family}
    early, last = curve_figures(rows[min(EARLY, len(rows)) - 1], honest, diligent), curve_figures(rows[-1], honest,
                                                                                                  diligent)
    passed, evaluated = pass_rate(run["records"], honest + [diligent], run["threshold"])
    return {"seed": run["seed"], "shares": shares, "good_share": share_over(rows, honest + [diligent]),
            "honest_max_min_ratio": max(early["honest_max_min_ratio"], last["honest_max_min_ratio"]),
            "diligent_over_honest": early["diligent_over_honest"],
            "diligent_over_honest_30w": last["diligent_over_honest"],
            "split_over_concentrated": last["split_over_concentrated"],
            "poc_passed": passed, "poc_evaluated": evaluated, "seconds": run["seconds"]}


def summarise(zoo: list[dict], majority: list[float]) -> dict:
    """The section's keys from the per-seed figures."""
    mean_share = {b: statistics.mean(z["shares"][b] for z in zoo) for b in zoo[0]["shares"]}
    out: dict = {f"{family}_share": max(mean_share[b] for b in members) for family, members in FAMILIES.items()}
    out["gamer_share"] = mean_share["parttime2"]
    out["mixer_majority_share"] = statistics.mean(majority)
    out["good_share"] = statistics.mean(z["good_share"] for z in zoo)
    for key in ("honest_max_min_ratio", "diligent_over_honest", "diligent_over_honest_30w",
                "split_over_concentrated"):
        out[key] = statistics.median(z[key] for z in zoo)
        out[f"{key}_per_seed"] = [z[key] for z in zoo]
    out["poc_honest_pass_rate"] = sum(z["poc_passed"] for z in zoo) / max(1, sum(z["poc_evaluated"] for z in zoo))
    out["shares_by_behaviour"] = mean_share
    out["shares_by_behaviour_max_seed"] = {b: max(z["shares"][b] for z in zoo) for b in mean_share}
    return out


def _collect(futures: list, label: str, trace_dir: str | None = None) -> list[dict]:
    """The workers' results in submission order, with a line on stderr as each one finishes (long runs), each
    run's records written to ``trace_dir`` as it arrives (``--reread`` sums up whatever finished)."""
    for done, future in enumerate(as_completed(futures), 1):
        row = future.result()
        if trace_dir:
            write_trace(row, trace_dir)
        print(f"[incentives] {label}: seed {row.get('seed')} done ({done}/{len(futures)})", file=sys.stderr, flush=True)
    return [f.result() for f in futures]


def is_zoo(run: dict) -> bool:
    return bool(run["roles"] == ZOO_ROLES)


def write_trace(run: dict, trace_dir: str) -> None:
    name = "zoo" if is_zoo(run) else "majority"
    Path(trace_dir).mkdir(parents=True, exist_ok=True)
    (Path(trace_dir) / f"{name}-{run['seed']}.json").write_text(json.dumps(run) + "\n")


def summarise_runs(cfg: dict, zoo_runs: list[dict], major_runs: list[dict]) -> dict:
    zoo = [zoo_figures(r) for r in zoo_runs]
    majority = [share_over(weights_of(r), uids_of(r["roles"], MAJORITY["mixers"])) for r in major_runs]
    return {**cfg, **summarise(zoo, majority), "mixer_majority_per_seed": majority, "zoo_runs": zoo}


def reread(cfg: dict, trace_dir: str) -> dict:
    """The section's figures from the runs written to ``trace_dir`` (the seeds that finished)."""
    runs = [json.loads(p.read_text()) for p in sorted(Path(trace_dir).glob("*.json"))]
    zoo_runs = [r for r in runs if is_zoo(r)]
    major_runs = [r for r in runs if not is_zoo(r)]
    windows = min(len(r["records"]) for r in zoo_runs)
    return summarise_runs({**cfg, "seeds": len(zoo_runs), "windows": windows,
                           "majority_seeds": len(major_runs)}, zoo_runs, major_runs)


def measure(cfg: dict, workers: int = 2, trace_dir: str | None = None) -> dict:
    majority_roles = ["honest"] * MAJORITY["honest"] + list(MAJORITY["mixers"])
    with worker_pool(workers) as pool:
        zoo_f, major_f = [], []
        first = cfg.get("first_seed", 1)
        for seed in range(first, first + cfg["seeds"]):  # interleaved: a cut-short run holds both kinds
            zoo_f.append(pool.submit(run_network, seed, ZOO_ROLES, cfg["windows"], cfg["model"], cfg["inner_steps"]))
            major_f.append(pool.submit(run_network, seed, majority_roles, cfg["majority_windows"], cfg["model"],
                                       cfg["inner_steps"]))
        runs = _collect(zoo_f + major_f, "zoo and mixer majority", trace_dir)
    zoo_runs, major_runs = runs[:len(zoo_f)], runs[len(zoo_f):]
    return summarise_runs(cfg, zoo_runs, major_runs)


def windows_to_lose(shares: list[float], switch: int, lost: float = LOST) -> int | None:
    """Windows from ``switch`` (counted) until the share is below ``lost``; None if it never drops below."""
    for t in range(switch, len(shares)):
        if shares[t] < lost:
            return t - switch + 1
    return None


def run_turncoat(seed: int, windows: int, honest: int, switch: int) -> dict:
    """In a worker: ``honest`` honest peers (tiny model); the best-paid uploads noise from window ``switch`` on."""
    from benchmarks.common import default_dataset, setup_worker
    setup_worker()
    from sim import behaviours
    from sim.simulator import SimNet

    hp = _hparams("tiny", seed)
    net = SimNet(hp, default_dataset(hp), ["honest"] * honest)
    turncoat: list[int] = []

    def turn(record) -> None:
        if record.window == switch - 1:
            turncoat.append(max(record.weights, key=lambda uid: (record.weights[uid], -uid), default=1))
            net.peers[turncoat[0] - 1].behaviour = behaviours.make("noise")
    records = net.run(windows, turn)
    shares = [r.weights.get(turncoat[0], 0.0) for r in records]
    return {"seed": seed, "windows_to_lose": windows_to_lose(shares, switch), "share_before": shares[switch - 1],
            "shares": shares}


def measure_turncoat(cfg: dict, workers: int = 2) -> dict:
    with worker_pool(workers) as pool:
        futures = [pool.submit(run_turncoat, seed, cfg["windows"], cfg["honest"], cfg["switch"])
                   for seed in range(1, cfg["seeds"] + 1)]
        rows = _collect(futures, "turncoat")
    lost = [r["windows_to_lose"] for r in rows]
    known = [n for n in lost if n is not None]
    return {**cfg, "windows_to_lose": lost, "median": statistics.median(known) if known else None,
            "max": max(known) if known else None, "never": sum(n is None for n in lost), "runs": rows}


def run(quick: bool) -> dict:
    out = measure(QUICK if quick else FULL)
    out["turncoat"] = measure_turncoat(TURNCOAT_QUICK if quick else TURNCOAT)
    return out


def markdown(result: dict) -> str:
    lines = [f"{result['seeds']} seeds, {result['model']} model, {result['inner_steps']} inner steps a window; the zoo "
             f"({HONEST} honest, 1 diligent, {len(ZOO_ROLES) - HONEST - 1} adversaries) for {result['windows']} "
             f"windows, {MAJORITY['honest']} honest beside {len(MAJORITY['mixers'])} mixers for "
             f"{result['majority_windows']}", "",
             "| behaviour | share of the weight (mean over seeds) | worst seed |", "|---|---:|---:|"]
    for b, share in result["shares_by_behaviour"].items():
        lines.append(f"| {b} | {share:.4f} | {result['shares_by_behaviour_max_seed'][b]:.4f} |")
    lines += ["", "| figure | value |", "|---|---:|"]
    for key in ("good_share", "mixer_majority_share", "honest_max_min_ratio", "diligent_over_honest",
                "diligent_over_honest_30w", "split_over_concentrated", "poc_honest_pass_rate"):
        lines.append(f"| {key} | {result[key]:.4g} |")
    c = result.get("turncoat")
    if c:
        lines += ["", f"**Turncoat** ({c['seeds']} seeds, {c['honest']} honest peers, the best-paid uploads noise from "
                  f"window {c['switch']} of {c['windows']}, tiny model): windows it keeps ≥ {LOST:.0%} of the weight, "
                  f"switch window counted: median {c['median']}, max {c['max']}, never lost in {c['never']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the quick mode's sizes")
    parser.add_argument("--seeds", type=int, help="seeds (default: the mode's)")
    parser.add_argument("--first-seed", type=int, default=1,
                        help="the first seed (to add seeds to a --trace-dir that holds the earlier ones)")
    parser.add_argument("--windows", type=int, help="zoo windows (default: the mode's)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (one torch thread each)")
    parser.add_argument("--turncoat", action="store_true", help="also measure the turncoat (tiny model)")
    parser.add_argument("--reread", action="store_true", help="sum up the runs already in --trace-dir")
    parser.add_argument("--out", help="write the result as JSON")
    parser.add_argument("--record", metavar="BENCH_JSON",
                        help="put the result in a full benchmark's file as its incentives section and check the "
                             "targets again (docs/bench-latest.json)")
    parser.add_argument("--trace-dir", help="write each run's per-window records there")
    args = parser.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    cfg.update({k: v for k, v in (("seeds", args.seeds), ("windows", args.windows)) if v})
    if args.first_seed != 1:
        cfg["first_seed"] = args.first_seed
    if args.reread and not args.trace_dir:
        parser.error("--reread needs --trace-dir")
    result = reread(cfg, args.trace_dir) if args.reread else measure(cfg, args.workers, args.trace_dir)
    if args.turncoat:
        result["turncoat"] = measure_turncoat({**TURNCOAT, "seeds": cfg["seeds"]}, args.workers)
    print(markdown(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if args.record:
        record(result, Path(args.record))
    return 0


def record(result: dict, bench_json: Path) -> None:
    """``result`` as the incentives section of a full benchmark's JSON, whose targets are checked again."""
    from benchmarks.targets import check_targets

    bench = json.loads(bench_json.read_text())
    bench["incentives"] = result
    bench["targets"] = check_targets(bench)
    bench_json.write_text(json.dumps(bench, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
