"""Robust aggregation under Byzantine attacks: cosine of each rule's aggregate to the honest mean.

20 honest peers (a shared direction plus per-peer noise of the same size, so a single honest update
has cosine ≈ 0.7 to the truth) and 5 Byzantine peers running each attack of
:data:`sim.attacks.ATTACKS`.  Also times every rule on a model-sized matrix (D = 3.3 M) unless
``--quick``.  Run: ``python scripts/benchmarks/robust.py [--quick] [--out DIR]`` (writes JSON + Markdown).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dso.aggregation.robust import RULES, robust_aggregate  # noqa: E402
from dso.config.schema import HParams  # noqa: E402
from sim.attacks import ATTACKS, byzantine_rows  # noqa: E402


def attack_table(honest: int = 20, byzantine: int = 5, dim: int = 2000, trim_beta: float = 0.2,
                 seed: int = 0) -> dict[str, dict[str, float]]:
    gen = torch.Generator().manual_seed(seed)
    truth = torch.randn(dim, generator=gen, dtype=torch.float64)
    rows = truth + torch.randn(honest, dim, generator=gen, dtype=torch.float64)
    honest_mean = rows.mean(dim=0)
    hp = HParams()
    hp.krum_f, hp.trim_beta = byzantine, trim_beta
    table: dict[str, dict[str, float]] = {rule: {} for rule in RULES}
    for attack in ATTACKS:
        X = torch.cat([rows, byzantine_rows(rows, attack, byzantine, gen)])
        for rule in RULES:
            agg, _ = robust_aggregate(rule, X, hp)
            table[rule][attack] = float(agg @ honest_mean / (agg.norm() * honest_mean.norm()))
    return table


def timings(peers: int = 25, dim: int = 3_279_104) -> dict[str, float]:
    X = torch.randn(peers, dim, generator=torch.Generator().manual_seed(0))
    hp = HParams()
    hp.krum_f = 5
    out = {}
    for rule in RULES:
        start = time.perf_counter()
        robust_aggregate(rule, X, hp)
        out[rule] = time.perf_counter() - start
    return out


def bench_robust(quick: bool) -> dict:
    torch.set_num_threads(1)
    result = {"setup": "20 honest (truth + N(0,1) noise per coordinate, D=2000) + 5 Byzantine; "
                       "cosine of the aggregate to the honest mean",
              "trim_beta_0.2": attack_table(trim_beta=0.2), "trim_beta_0.1": attack_table(trim_beta=0.1)}
    if not quick:
        result["seconds_25_peers_3.3M"] = timings()
    return result


def markdown(result: dict) -> str:
    out = [result["setup"], ""]
    for key in ("trim_beta_0.2", "trim_beta_0.1"):
        table = result[key]
        out += [f"**{key.replace('_', ' ')}**", "", "| rule | " + " | ".join(ATTACKS) + " |",
                "|---|" + "---:|" * len(ATTACKS)]
        out += [f"| {rule} | " + " | ".join(f"{table[rule][a]:.3f}" for a in ATTACKS) + " |" for rule in RULES]
        out.append("")
    if "seconds_25_peers_3.3M" in result:
        out += ["| rule | seconds (25 × 3.3 M, 1 thread) |", "|---|---:|"]
        out += [f"| {r} | {s:.2f} |" for r, s in result["seconds_25_peers_3.3M"].items()]
    return "\n".join(out)


def run(quick: bool) -> dict:
    """Entry point of the ``robust`` section of scripts/bench.py."""
    return bench_robust(quick)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", help="folder for robust.json and robust.md")
    args = parser.parse_args()
    res = bench_robust(args.quick)
    text = markdown(res)
    print(text)
    if args.out:
        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "robust.json").write_text(json.dumps(res, indent=2))
        (folder / "robust.md").write_text(text + "\n")
