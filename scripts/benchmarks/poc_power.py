"""How strong is the proof of computation on the default model and data?  (The figures behind docs/scoring.md.)

    python scripts/benchmarks/poc_power.py [--windows 10] [--steps 9] [--out DIR]

The simulator (the validator's real window engine) runs four honest peers, a diligent one (twice the sequences
a window), and peers that do the same compute on other data or none on their own (``wrongdata``, ``othertext``,
``fixedbatch``, ``mixall``, ``noisymix``), every one of them evaluated in every window, at ``--steps`` inner steps a
window (9: what a miner of the default local network gets through).  For each behaviour: the test statistic's
mean and spread over the evaluations, and the share at or above ``poc_threshold`` (one test) and of record means
at or above it (the pay rule's reading).  Writes ``poc_power.json`` and ``poc_power.md`` to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.path.insert(1, str(Path(__file__).resolve().parents[2]))

ROLES = ["honest"] * 4 + ["diligent", "wrongdata", "othertext", "fixedbatch", "mixall", "noisymix"]


def by_behaviour(records: list[dict], roles: list[str]) -> dict[str, list[list[float]]]:
    """Each behaviour's statistics, one list per peer in window order."""
    out: dict[str, list[list[float]]] = {}
    for uid, role in enumerate(roles, start=1):
        out.setdefault(role, []).append([r["poc_statistics"][str(uid)] for r in records
                                         if str(uid) in r["poc_statistics"]])
    return out


def figures(per_peer: list[list[float]], threshold: float, memory: int) -> dict:
    """Mean and spread of one behaviour's statistics; the share of single tests that reach ``threshold``, and of
    records (the last ``memory`` tests after each evaluation from the second on) that the pay rule reads as proven
    work (``scoring.formulas.work_proven``)."""
    from scoring.formulas import work_proven
    flat = [z for peer in per_peer for z in peer]
    records = [peer[max(0, i + 1 - memory):i + 1] for peer in per_peer for i in range(1, len(peer))]
    return {"evaluations": len(flat), "mean": statistics.fmean(flat), "sd": statistics.pstdev(flat),
            "single_pass": sum(z >= threshold for z in flat) / len(flat),
            "record_pass": sum(work_proven(r, threshold) for r in records) / len(records) if records else None}


def measure(windows: int, steps: int, seed: int = 1) -> dict:
    from benchmarks.common import default_dataset, setup_worker
    setup_worker()
    from dso.config.schema import HParams
    from sim.simulator import SimNet

    hp = HParams(seed=seed)
    hp.eval_peers = len(ROLES)
    net = SimNet(hp, default_dataset(hp), ROLES, inner_steps=steps)
    records = []
    for t in range(windows):
        records.append(net.step(t).to_dict())
        tests = ", ".join(f"{u}: {z:.2f}" for u, z in records[-1]["poc_statistics"].items())
        print(f"[poc_power] window {t}: {tests}", file=sys.stderr, flush=True)
    groups = by_behaviour(records, ROLES)
    return {"windows": windows, "steps": steps, "seed": seed, "threshold": hp.poc_threshold, "memory": hp.poc_memory,
            "poc_sequences": hp.poc_sequences, "poc_fraction": hp.poc_fraction, "eval_sequences": hp.eval_sequences,
            "behaviours": {role: figures(per_peer, hp.poc_threshold, hp.poc_memory) for role, per_peer in
                           groups.items()},
            "statistics": {role: per_peer for role, per_peer in groups.items()}}


def markdown(result: dict) -> str:
    lines = [f"default model, seed {result['seed']}, {result['steps']} inner steps a window, {result['windows']} "
             f"windows, every peer evaluated every window; threshold {result['threshold']:g}, record of "
             f"{result['memory']}", "",
             "| behaviour | evaluations | mean statistic | sd | one test passes | record proves work |",
             "|---|---:|---:|---:|---:|---:|"]
    for role, f in result["behaviours"].items():
        record = "—" if f["record_pass"] is None else f"{f['record_pass']:.0%}"
        lines.append(f"| {role} | {f['evaluations']} | {f['mean']:.2f} | {f['sd']:.2f} | {f['single_pass']:.0%} | "
                     f"{record} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="docs/sim/poc_power")
    parser.add_argument("--reread", help="a poc_power.json to read the figures from again (no new run)")
    args = parser.parse_args(argv)
    if args.reread:
        result = json.loads(Path(args.reread).read_text())
        result["behaviours"] = {role: figures(per_peer, result["threshold"], result["memory"])
                                for role, per_peer in result["statistics"].items()}
    else:
        result = measure(args.windows, args.steps, args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "poc_power.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "poc_power.md").write_text(markdown(result) + "\n")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
