"""Replay the pay rule on recorded simulator runs: rule variants for the price of a few milliseconds (issue 17).

``incentives.py --trace-dir DIR`` writes one ``trace-<seed>.json`` per seed: per window, who was evaluated, their
LossScore (δ_rand) and δ_assigned, and the rejections.  This script feeds those outcomes through the validator's
own code — the OpenSkill match (``rate_match``), the proof-of-computation EMA (``poc_update`` / ``poc_no_work``),
the penalty of a rejected peer and the pay rule (``scoring.pay.pay``) — under other hyper-parameters, and reports
the ``incentives`` figures (honest max/min, diligent over honest mean) plus how often honest peers are cut by each
gate.  The training trajectory is the recorded one: a variant that would aggregate different peers would have
trained a slightly different model, so a replay is an estimate, checked against the real run of the defaults.

    python scripts/benchmarks/pay_replay.py DIR --lever poc_floor=-0.2 --lever help_share=0.1 --warmup 5
    python scripts/benchmarks/pay_replay.py DIR --sweep      # the grid docs/scoring.md reports
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.path.insert(1, str(Path(__file__).resolve().parents[2]))

from benchmarks.incentives import WIN, seed_figures  # noqa: E402
from dso.config import HParams  # noqa: E402
from scoring import formulas  # noqa: E402
from scoring.pay import pay, record_evaluation  # noqa: E402
from scoring.rating import rate_match  # noqa: E402
from scoring.state import PeerState  # noqa: E402


def load(folder: str | Path) -> list[dict]:
    """The traces in ``folder``, by seed."""
    traces = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("trace-*.json"))]
    return sorted(traces, key=lambda t: t["seed"])


def replay(trace: dict, hp: HParams, warmup: int = 5) -> dict:
    """One recorded run under ``hp``: per-seed figures and, over honest peer-windows from ``warmup`` on, the share
    cut by the proof-of-computation gate and by the help gate."""
    roles = trace["roles"]
    uids = list(range(1, len(roles) + 1))
    honest = [u for u, r in zip(uids, roles) if r == "honest"]
    peers = {u: PeerState() for u in uids}
    posted: dict[int, float] = {}
    weights, poc_cut, help_cut, seen, drift = [], 0, 0, 0, 0.0
    for row in trace["rows"]:
        losses = {int(u): v for u, v in row["loss_scores"].items()}
        assigned = {int(u): v for u, v in row.get("assigned_deltas", {}).items()}
        rejected = {int(u) for u in row["rejections"]}
        for uid in rejected:
            peers[uid].mu = formulas.penalise(peers[uid].mu, hp.fast_penalty)
        median = formulas.help_median(losses.values())
        for uid, loss in losses.items():
            record_evaluation(peers[uid], loss, assigned.get(uid, loss), median, hp)
        for uid, (mu, sigma) in rate_match({u: peers[u].rating for u in losses}, losses, hp.rating_beta,
                                           hp.rating_tau).items():
            peers[uid].rating_mu, peers[uid].rating_sigma = mu, sigma
        _, _, posted, _ = pay(peers, hp, posted, rejected)
        weights.append(posted)
        drift = max(drift, *(abs(posted.get(int(u), 0.0) - w) for u, w in row["weights"].items()))
        if row["window"] >= warmup:
            for uid in honest:
                seen += 1
                poc_cut += not formulas.poc_passes(peers[uid].mu, peers[uid].eval_count, hp.poc_floor)
                help_cut += not formulas.helped_recently(peers[uid].help_ratios, hp.help_share, hp.help_rule)
    diligent = next(u for u, r in zip(uids, roles) if r == "diligent")
    return {**seed_figures(weights, honest, diligent), "poc_cut": poc_cut / max(seen, 1),
            "help_cut": help_cut / max(seen, 1), "drift_from_recorded": drift,
            "honest_mu": [peers[u].mu for u in honest], "diligent_mu": peers[diligent].mu}


def poc_statistics(traces: list[dict], warmup: int = 5) -> dict:
    """From window ``warmup`` on, per role: how often δ_assigned > δ_rand (the PoC sign test), how often the
    LossScore is ≤ 0, and the LossScores' spread around the window's honest mean (what the calibrated test in
    tests/unit/scoring/test_scoring_pay.py draws from)."""
    out: dict = {}
    for role in ("honest", "diligent"):
        signs, nonpositive, n, relative, gaps = 0, 0, 0, [], []
        for trace in traces:
            mine = {str(u) for u, r in enumerate(trace["roles"], 1) if r == role}
            honest = {str(u) for u, r in enumerate(trace["roles"], 1) if r == "honest"}
            for row in trace["rows"]:
                honest_scores = [v for u, v in row["loss_scores"].items() if u in honest]
                mean = statistics.mean(honest_scores) if honest_scores else 0.0
                for uid, loss in row["loss_scores"].items():
                    if uid in mine and row["window"] >= warmup:
                        n += 1
                        signs += row["assigned_deltas"][uid] > loss
                        nonpositive += not loss > 0
                        if mean > 0:
                            relative.append(loss / mean)
                            gaps.append((row["assigned_deltas"][uid] - loss) / mean)
        out[role] = {"evaluations": n, "poc_positive": signs / max(n, 1),
                     "loss_score_nonpositive": nonpositive / max(n, 1),
                     "loss_over_honest_mean": _spread(relative), "poc_gap_over_honest_mean": _spread(gaps)}
    return out


def _spread(values: list[float]) -> dict:
    if len(values) < 2:
        return {}
    return {"median": statistics.median(values), "mean": statistics.mean(values), "sd": statistics.stdev(values)}


def summary(traces: list[dict], hp: HParams, warmup: int = 5) -> dict:
    runs = [replay(t, hp, warmup) for t in traces]
    ratios = [r["honest_max_min_ratio"] for r in runs]
    margins = [r["diligent_over_honest"] for r in runs]
    return {"median_ratio": statistics.median(ratios), "ratios": ratios, "margins": margins,
            "wins": sum(m >= WIN for m in margins), "seeds": len(runs),
            "poc_cut": statistics.mean(r["poc_cut"] for r in runs),
            "help_cut": statistics.mean(r["help_cut"] for r in runs),
            "drift_from_recorded": max(r["drift_from_recorded"] for r in runs)}


def _hp(levers: dict[str, str]) -> HParams:
    hp = HParams()
    for key, value in levers.items():
        setattr(hp, key, type(getattr(hp, key))(value))
    hp.validate("hparams")
    return hp


def _line(levers: dict, s: dict) -> str:
    return (f"{levers}: median ratio {s['median_ratio']:.2f} (" + ", ".join(f"{r:.3g}" for r in s["ratios"])
            + f"); diligent wins {s['wins']}/{s['seeds']} (" + ", ".join(f"{m:.2f}" for m in s["margins"])
            + f"); honest cut by PoC {s['poc_cut']:.1%}, by help gate {s['help_cut']:.1%}; largest difference from "
            f"the recorded weights {s['drift_from_recorded']:.2g}")


SWEEP = {"poc_floor": ["-0.15", "-0.2", "-0.25", "-0.3"], "help_share": ["0.0", "0.1", "0.2", "0.3"],
         "weight_power": ["0.7", "1.0"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="a folder of trace-<seed>.json (incentives.py --trace-dir)")
    parser.add_argument("--lever", action="append", default=[], help="KEY=VALUE, any hparams key")
    parser.add_argument("--warmup", type=int, default=5, help="gate figures count windows from this one on")
    parser.add_argument("--sweep", action="store_true", help="the grid of SWEEP")
    args = parser.parse_args(argv)
    traces = load(args.folder)
    if not traces:
        parser.error(f"no trace-*.json in {args.folder}")
    print(json.dumps(poc_statistics(traces, args.warmup)))
    base = dict(lever.split("=", 1) for lever in args.lever)
    grid = ([dict(zip(SWEEP, values)) for values in itertools.product(*SWEEP.values())] if args.sweep else [{}])
    for extra in grid:
        levers = {**base, **extra}
        print(_line(levers, summary(traces, _hp(levers), args.warmup)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
