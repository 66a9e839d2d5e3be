"""Does a noise miner pass the help gate by luck?  The adversary zoo's network in the simulator, every help rule.

The end-to-end zoo test (tests/e2e/test_adversaries.py) runs a few real processes for a dozen windows; a run
where the ``noise`` miner is paid fails it, and one CI run did (docs/scoring.md, "A noise update as good as the
median").  This script runs the same network (``sim.networks.zoo_simnet``: |S_t| = 5, the zoo's roles) in the
simulator over many seeds, records each peer's help record and proof-of-computation μ after every window, and
reads them under each ``help_rule``:

* ``noise_passing``: noise peer-windows whose record passes the help gate;
* ``noise_paid``: … whose μ also passes the proof-of-computation gate (``poc_floor``), and the seeds they fall in;
* ``honest_cut`` / ``diligent_cut``: their peer-windows (with a record) that the help gate cuts.

The run itself follows the default rule.  A rule's cuts shape the top-G list, so a run under another rule would
record slightly different histories; each rule here is read from the same ones.

    python scripts/benchmarks/noise_gate.py --seeds 50 --windows 20 --out noise_gate.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.path.insert(1, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import setup_worker, worker_pool  # noqa: E402
from scoring import formulas  # noqa: E402
from sim.networks import ZOO_ROLES  # noqa: E402


def run_seed(seed: int, windows: int) -> dict:
    """Per window, each peer's help record, μ and evaluation count after the window."""
    setup_worker()
    from dso.corpus import stdlib_prose
    from sim.networks import zoo_simnet

    net = zoo_simnet(seed, str(stdlib_prose()), str(Path.home() / ".cache" / "dso" / "noise_gate"))
    rows = []
    for t in range(windows):
        net.step(t)
        rows.append({uid: (list(p.help_ratios), p.mu, p.eval_count) for uid, p in net.state.peers.items()})
    return {"seed": seed, "rows": rows, "poc_floor": net.hp.poc_floor, "help_share": net.hp.help_share}


def read_rule(runs: list[dict], rule: str) -> dict:
    """The gate figures of one help rule over every recorded peer-window."""
    counts = {"noise_passing": 0, "noise_paid": 0, "honest_cut": 0, "diligent_cut": 0,
              "noise_windows": 0, "honest_windows": 0, "diligent_windows": 0}
    paid_seeds: set[int] = set()
    for run in runs:
        for row in run["rows"]:
            for uid, record in row.items():
                if count_peer_window(counts, ZOO_ROLES[int(uid) - 1], record, run, rule):
                    paid_seeds.add(run["seed"])
    return {**counts, "noise_paid_seeds": sorted(paid_seeds)}


def count_peer_window(counts: dict, role: str, record: tuple, run: dict, rule: str) -> bool:
    """Add one peer-window to ``counts``; True when it is a noise peer the rule would pay."""
    ratios = record[0]
    if not ratios or role not in ("honest", "diligent", "noise"):
        return False
    passes = formulas.helped_recently(ratios, run["help_share"], rule)
    counts[f"{role}_windows"] += 1
    if role != "noise":
        counts[f"{role}_cut"] += not passes
        return False
    counts["noise_passing"] += passes
    paid = formulas.gates_pay(*record, run["help_share"], run["poc_floor"], rule)
    counts["noise_paid"] += paid
    return paid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--windows", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2, help="worker processes (one torch thread each)")
    parser.add_argument("--out", help="write the figures here as JSON")
    args = parser.parse_args(argv)
    with worker_pool(args.workers) as pool:
        futures = [pool.submit(run_seed, seed, args.windows) for seed in range(args.seeds)]
        runs = []
        for seed, future in enumerate(futures):
            runs.append(future.result())
            print(f"[noise_gate] seed {seed} done ({seed + 1}/{args.seeds})", file=sys.stderr, flush=True)
    rules = {rule: read_rule(runs, rule) for rule in formulas.HELP_RULES}
    result = {"seeds": args.seeds, "windows": args.windows, "rules": rules}
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
