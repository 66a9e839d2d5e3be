"""Incentives section: does equal work earn equal pay, and more work more? (issue 17)

The in-process simulator (sim/simulator.py, the validator's real window engine) runs ``honest`` identical
honest peers and one diligent peer (twice the data per window) for W windows, over 10 seeds (``hp.seed``
changes the model's initialisation, the data assignment, the validator's secret and the chain randomness).
From the weights of the last window, per seed:

* ``honest_max_min_ratio``: the largest over the smallest share among the identical honest peers; a peer
  with no weight counts as a share of ``ZERO_SHARE``, so the ratio stays finite (≥ 1e6: an honest peer got
  nothing);
* ``diligent_over_honest``: the diligent peer's share over the honest mean;
* ``diligent_wins_of_10``: seeds where that is at least ``WIN``.

Each is reported as the median over seeds and the per-seed list, and again from the weights averaged over
the last ``SMOOTH`` windows (``smoothed``: what smoothing the posted weights would give).  Targets
(scripts/benchmarks/targets.py): ratio ≤ 2 in the median seed, diligent wins ≥ 9 of 10.

``gamer``: a miner that trains only when it expects evaluation (sim/foresight.py gives it everything but
the future randomness) among ``GAMER["honest"]`` honest peers, |S_t| = 2, tiny model, under the drawn
schedule and the old round robin: its final and cumulative (mean over windows) weight share per seed, next
to an honest peer's mean, and the share of windows it trained in.

``turncoat``: the price of stable weights.  Among ``TURNCOAT["honest"]`` honest peers, the best-paid one turns to
noise at window ``switch`` (tiny model); ``windows_to_lose`` = windows it is still paid at least ``LOST`` of the weight,
counting the switch window (1: its first bad window already pays it less than 1 %).

``python scripts/benchmarks/incentives.py --lever eval_peers=2 --lever rating=7,0.1 --seeds 4`` runs the
same measurement with other settings (levers: any ``hparams`` key; ``rating=β,τ`` is short for
``rating_beta=β --lever rating_tau=τ``); it is how the numbers in docs/scoring.md were measured.
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

FULL = {"seeds": 10, "windows": 20, "honest": 4, "tiny": False}
QUICK = {"seeds": 2, "windows": 3, "honest": 2, "tiny": True}
GAMER = {"seeds": 10, "windows": 40, "honest": 6, "eval_peers": 2}
GAMER_QUICK = {"seeds": 1, "windows": 4, "honest": 6, "eval_peers": 2}
TURNCOAT = {"seeds": 10, "windows": 20, "honest": 4, "switch": 10}
TURNCOAT_QUICK = {"seeds": 1, "windows": 6, "honest": 3, "switch": 3}
LOST = 0.01  # a turncoat has lost its weight once its share is below this
ZERO_SHARE = 1e-6
WIN = 1.5
SMOOTH = 5


# ---------------------------------------------------------------- formulas
def max_min_ratio(shares: list[float]) -> float:
    """Largest over smallest share (a zero share counts as ZERO_SHARE; nobody paid at all counts as the worst,
    1 / ZERO_SHARE, not as equality)."""
    if not max(shares) > 0:
        return 1.0 / ZERO_SHARE
    return max(shares) / max(min(shares), ZERO_SHARE)


def over_mean(share: float, others: list[float]) -> float:
    """``share`` over the mean of ``others`` (a zero mean counts as ZERO_SHARE)."""
    return share / max(sum(others) / len(others), ZERO_SHARE)


def seed_figures(weights: list[dict[int, float]], honest: list[int], diligent: int, smooth: int = SMOOTH) -> dict:
    """The per-seed figures from one run's per-window weights (uid → share)."""
    last = weights[-1]
    tail = weights[-smooth:]
    mean = {u: sum(w.get(u, 0.0) for w in tail) / len(tail) for u in [*honest, diligent]}
    return {
        "honest_shares": [last.get(u, 0.0) for u in honest], "diligent_share": last.get(diligent, 0.0),
        "honest_max_min_ratio": max_min_ratio([last.get(u, 0.0) for u in honest]),
        "diligent_over_honest": over_mean(last.get(diligent, 0.0), [last.get(u, 0.0) for u in honest]),
        "smoothed_honest_max_min_ratio": max_min_ratio([mean[u] for u in honest]),
        "smoothed_diligent_over_honest": over_mean(mean[diligent], [mean[u] for u in honest]),
    }


def summarise(per_seed: list[dict]) -> dict:
    """Medians, per-seed lists and quartiles over seeds; wins of the diligent peer."""
    out: dict = {"seeds": len(per_seed)}
    for prefix in ("", "smoothed_"):
        for name in ("honest_max_min_ratio", "diligent_over_honest"):
            values = [s[prefix + name] for s in per_seed]
            out[prefix + name] = {"median": statistics.median(values), "per_seed": values,
                                  "quartiles": _quartiles(values)}
        out[prefix + "diligent_wins_of_10"] = round(
            10 * sum(s[prefix + "diligent_over_honest"] >= WIN for s in per_seed) / len(per_seed), 1)
    return out


def _quartiles(values: list[float]) -> list[float]:
    if len(values) < 2:
        return [values[0], values[0]] if values else []
    q = statistics.quantiles(values, n=4, method="inclusive")
    return [q[0], q[2]]


# ------------------------------------------------------------------ runs
def run_seed(seed: int, windows: int, honest: int, tiny: bool, levers: dict | None = None,
             trace_dir: str | None = None) -> dict:
    """In a worker: one simulated run; per-window weights and the per-seed figures.  ``trace_dir``: also write the
    run's per-window records there (``trace-<seed>.json``, what scripts/benchmarks/pay_replay.py replays)."""
    from benchmarks.common import default_dataset, setup_worker
    setup_worker()
    from dso.config import HParams, ModelConfig
    from dso.config_sources import set_key
    from sim.simulator import SimNet

    hp = HParams(seed=seed)
    if tiny:
        hp.model = ModelConfig(d_model=32, n_layers=1, n_heads=2, ffn_hidden=64, seq_len=32)
        hp.batch_size, hp.assigned_sequences, hp.micro_batch, hp.chunk, hp.topk = 8, 16, 8, 16, 8
    for key, value in _hparam_levers(levers).items():
        _set_hparam(hp, key, value, set_key)
    roles = ["honest"] * honest + ["diligent"]
    records = SimNet(hp, default_dataset(hp), roles).run(windows)
    weights = [r.weights for r in records]
    figures = seed_figures(weights, list(range(1, honest + 1)), honest + 1)
    if trace_dir:
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
        trace = {"seed": seed, "roles": roles, "levers": _hparam_levers(levers), "rows": [r.to_dict() for r in records]}
        (Path(trace_dir) / f"trace-{seed}.json").write_text(json.dumps(trace) + "\n")
    return {"seed": seed, **figures, "val_loss": records[-1].val_loss, "seconds": sum(r.seconds for r in records),
            "rejections": rejection_counts(r.rejections for r in records)}


def rejection_counts(rows) -> dict[str, int]:
    """How often each rejection reason was given over a run (the pay rule's gates act on these)."""
    counts: dict[str, int] = {}
    for row in rows:
        for reason in row.values():
            counts[reason] = counts.get(reason, 0) + 1
    return dict(sorted(counts.items()))


def _collect(futures: list, label: str) -> list[dict]:
    """The workers' results in submission order, with a line on stderr as each one finishes (long runs)."""
    for done, future in enumerate(as_completed(futures), 1):
        row = future.result()
        print(f"[incentives] {label}: seed {row.get('seed')} done ({done}/{len(futures)})", file=sys.stderr, flush=True)
    return [f.result() for f in futures]


def _hparam_levers(levers: dict | None) -> dict:
    """Levers as hparams keys: ``rating=(β, τ)`` is shorthand for rating_beta and rating_tau."""
    out = dict(levers or {})
    rating = out.pop("rating", None)
    if rating is not None:
        out["rating_beta"], out["rating_tau"] = str(rating[0]), str(rating[1])
    return out


def _set_hparam(hp, key: str, value, set_key) -> None:
    from dso.config import Config
    cfg = Config()
    cfg.hparams = hp
    set_key(cfg, f"hparams.{key}", value)


def run_gamer(seed: int, schedule: str, windows: int, honest: int, eval_peers: int) -> dict:
    """In a worker: the gamer among ``honest`` honest peers under one evaluation schedule."""
    from benchmarks.common import default_dataset, setup_worker
    setup_worker()
    from dso.config import HParams, ModelConfig
    from sim.simulator import SimNet

    hp = HParams(seed=seed, model=ModelConfig(d_model=32, n_layers=1, n_heads=2, ffn_hidden=64, seq_len=32))
    hp.batch_size, hp.assigned_sequences, hp.micro_batch, hp.chunk, hp.topk = 8, 16, 8, 16, 8
    hp.eval_peers, hp.eval_schedule = eval_peers, schedule
    records = SimNet(hp, default_dataset(hp), ["honest"] * honest + ["gamer"]).run(windows)
    gamer = honest + 1
    cumulative = sum(r.weights.get(gamer, 0.0) for r in records) / len(records)
    return {"seed": seed, "final": records[-1].weights.get(gamer, 0.0), "cumulative": cumulative,
            "honest_mean_final": sum(records[-1].weights.get(u, 0.0) for u in range(1, gamer)) / honest,
            "trained_share": sum(gamer in r.trained for r in records) / len(records),
            "evaluated": sum(gamer in r.evaluated for r in records),
            "evaluated_on_zeros": sum(gamer in r.evaluated and gamer not in r.trained for r in records)}


def measure_gamer(cfg: dict, workers: int = 2) -> dict:
    with worker_pool(workers) as pool:
        futures = {s: [pool.submit(run_gamer, seed, s, cfg["windows"], cfg["honest"], cfg["eval_peers"])
                       for seed in range(1, cfg["seeds"] + 1)] for s in ("random", "round_robin")}
        runs = {s: _collect(fs, f"gamer {s}") for s, fs in futures.items()}
    out: dict = {**cfg}
    for schedule, rows in runs.items():
        out[schedule] = {"final_mean": statistics.mean(r["final"] for r in rows),
                         "final_max": max(r["final"] for r in rows),
                         "cumulative_mean": statistics.mean(r["cumulative"] for r in rows),
                         "honest_mean_final": statistics.mean(r["honest_mean_final"] for r in rows),
                         "trained_share": statistics.mean(r["trained_share"] for r in rows), "runs": rows}
    return out


def windows_to_lose(shares: list[float], switch: int, lost: float = LOST) -> int | None:
    """Windows from ``switch`` (counted) until the share is below ``lost``; None if it never drops below."""
    for t in range(switch, len(shares)):
        if shares[t] < lost:
            return t - switch + 1
    return None


def run_turncoat(seed: int, windows: int, honest: int, switch: int, levers: dict | None = None) -> dict:
    """In a worker: ``honest`` honest peers (tiny model); the best-paid uploads noise from window ``switch`` on."""
    from benchmarks.common import default_dataset, setup_worker
    setup_worker()
    from dso.config import HParams, ModelConfig
    from dso.config_sources import set_key
    from sim.simulator import SimNet

    hp = HParams(seed=seed, model=ModelConfig(d_model=32, n_layers=1, n_heads=2, ffn_hidden=64, seq_len=32))
    hp.batch_size, hp.assigned_sequences, hp.micro_batch, hp.chunk, hp.topk = 8, 16, 8, 16, 8
    for key, value in _hparam_levers(levers).items():
        _set_hparam(hp, key, value, set_key)
    net = SimNet(hp, default_dataset(hp), ["honest"] * honest)

    turncoat: list[int] = []

    def turn(record) -> None:
        if record.window == switch - 1:
            turncoat.append(max(record.weights, key=lambda uid: (record.weights[uid], -uid), default=1))
            net.peers[turncoat[0] - 1].behaviour = "noise"
    records = net.run(windows, turn)
    shares = [r.weights.get(turncoat[0], 0.0) for r in records]
    return {"seed": seed, "windows_to_lose": windows_to_lose(shares, switch), "share_before": shares[switch - 1],
            "shares": shares}


def measure_turncoat(cfg: dict, levers: dict | None = None, workers: int = 2) -> dict:
    with worker_pool(workers) as pool:
        futures = [pool.submit(run_turncoat, seed, cfg["windows"], cfg["honest"], cfg["switch"], levers)
                   for seed in range(1, cfg["seeds"] + 1)]
        rows = _collect(futures, "turncoat")
    lost = [r["windows_to_lose"] for r in rows]
    known = [n for n in lost if n is not None]
    return {**cfg, "windows_to_lose": lost, "median": statistics.median(known) if known else None,
            "max": max(known) if known else None, "never": sum(n is None for n in lost), "runs": rows}


def measure(cfg: dict, levers: dict | None = None, workers: int = 2, trace_dir: str | None = None) -> dict:
    with worker_pool(workers) as pool:
        futures = [pool.submit(run_seed, seed, cfg["windows"], cfg["honest"], cfg["tiny"], levers, trace_dir)
                   for seed in range(1, cfg["seeds"] + 1)]
        per_seed = _collect(futures, "fairness")
    out = summarise(per_seed)
    out.update({"windows": cfg["windows"], "honest_peers": cfg["honest"], "tiny_model": cfg["tiny"],
                "levers": {k: list(v) if isinstance(v, tuple) else v for k, v in (levers or {}).items()},
                "runs": per_seed})
    return out


def run(quick: bool) -> dict:
    out = measure(QUICK if quick else FULL)
    out["gamer"] = measure_gamer(GAMER_QUICK if quick else GAMER)
    out["turncoat"] = measure_turncoat(TURNCOAT_QUICK if quick else TURNCOAT)
    return out


def markdown(result: dict) -> str:
    def row(name: str) -> str:
        m = result[name]
        return (f"| {name} | {m['median']:.3g} | {m['quartiles'][0]:.3g}–{m['quartiles'][1]:.3g} | "
                + ", ".join(f"{v:.3g}" for v in m["per_seed"]) + " |")
    lines = [f"{result['seeds']} seeds, {result['honest_peers']} identical honest peers + 1 diligent, "
             f"{result['windows']} windows" + (" (tiny model)" if result["tiny_model"] else "")
             + (f", levers {result['levers']}" if result.get("levers") else ""), "",
             "| figure | median | quartiles | per seed |", "|---|---:|---:|---|"]
    for prefix in ("", "smoothed_"):
        lines += [row(prefix + "honest_max_min_ratio"), row(prefix + "diligent_over_honest")]
    lines += ["", f"diligent ≥ {WIN}× the honest mean in {result['diligent_wins_of_10']:g} of 10 seeds "
              f"({result['smoothed_diligent_wins_of_10']:g} with weights averaged over the last {SMOOTH} windows)"]
    g = result.get("gamer")
    if g:
        lines += ["", f"**Gamer** ({g['seeds']} seeds, {g['honest']} honest peers + the gamer, |S_t| = "
                  f"{g['eval_peers']}, {g['windows']} windows, tiny model)", "",
                  "| schedule | gamer final share (mean, max) | gamer cumulative share | honest peer's final share "
                  "| windows it trained |", "|---|---:|---:|---:|---:|"]
        for schedule in ("random", "round_robin"):
            s = g[schedule]
            lines.append(f"| {schedule} | {s['final_mean']:.4f}, {s['final_max']:.4f} | {s['cumulative_mean']:.4f} | "
                         f"{s['honest_mean_final']:.4f} | {s['trained_share']:.0%} |")
    c = result.get("turncoat")
    if c:
        lines += ["", f"**Turncoat** ({c['seeds']} seeds, {c['honest']} honest peers, the best-paid uploads noise from "
                  f"window {c['switch']} of {c['windows']}, tiny model): windows it keeps ≥ {LOST:.0%} of the weight, "
                  f"switch window counted: median {c['median']}, max {c['max']}, never lost in {c['never']} "
                  f"(per seed {c['windows_to_lose']})"]
    return "\n".join(lines)


def _lever(text: str) -> tuple[str, object]:
    key, _, value = text.partition("=")
    if key == "rating":
        beta, tau = value.split(",")
        return key, (float(beta), float(tau))
    return key, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lever", action="append", default=[], type=_lever, help="KEY=VALUE or rating=BETA,TAU")
    parser.add_argument("--seeds", type=int, default=FULL["seeds"])
    parser.add_argument("--windows", type=int, default=FULL["windows"])
    parser.add_argument("--honest", type=int, default=FULL["honest"])
    parser.add_argument("--tiny", action="store_true", help="the tiny model of the quick mode")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (one torch thread each)")
    parser.add_argument("--turncoat", action="store_true", help="also measure the turncoat (tiny model)")
    parser.add_argument("--turncoat-only", action="store_true", help="only the turncoat")
    parser.add_argument("--out", help="write the result as JSON")
    parser.add_argument("--trace-dir", help="write each seed's per-window records there (for pay_replay.py)")
    args = parser.parse_args(argv)
    cfg = {"seeds": args.seeds, "windows": args.windows, "honest": args.honest, "tiny": args.tiny}
    if args.turncoat_only:
        result = {"turncoat": measure_turncoat({**TURNCOAT, "seeds": args.seeds}, dict(args.lever), args.workers)}
        print(json.dumps({k: v for k, v in result["turncoat"].items() if k != "runs"}))
    else:
        result = measure(cfg, dict(args.lever), args.workers, args.trace_dir)
        if args.turncoat:
            result["turncoat"] = measure_turncoat({**TURNCOAT, "seeds": args.seeds}, dict(args.lever), args.workers)
        print(markdown(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
