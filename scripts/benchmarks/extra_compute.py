"""How should a miner with twice the compute spend it: twice the inner steps, or steps of twice the sequences?

The in-process simulator (sim/simulator.py) runs ``honest`` honest peers (``steps`` inner AdamW steps of
``hparams.batch_size`` sequences per window) and one diligent peer with twice their compute, spent one way:

* ``steps``: 2 × ``steps`` steps of ``batch_size`` sequences;
* ``batch``: ``steps`` steps of 2 × ``batch_size`` sequences.

Every window, every peer's update is scored as the validator scores it (``scoring.evaluation.update_step`` and
``evaluate_peer``: the outer rule's step from θ_t with the peer's update, the window's median norm) on one fixed
sample of ``sequences`` random sequences, larger than the validator's so that the comparison is not noise.
Reported per variant: the diligent peer's LossScore over the honest mean, per window and over the run (ratio
of the sums), the windows it beats the honest mean in, and the final validation loss.  The network itself
advances by the default engine (scoring/window.py), so both variants see the same protocol.

``python scripts/benchmarks/extra_compute.py --windows 6 --steps 10`` is the measurement in docs/training.md
("Fifth pass"); it writes ``extra_compute.json``, ``extra_compute.md`` and ``extra_compute.png`` to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import as_completed
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.path.insert(1, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import save_plot, worker_pool  # noqa: E402

VARIANTS = ("steps", "batch")


def diligent_ratio(scores: dict[int, float], honest: list[int], diligent: int) -> float:
    """The diligent peer's LossScore over the honest mean (nan when the honest mean is not positive)."""
    mean = statistics.mean(scores[u] for u in honest)
    return scores[diligent] / mean if mean > 0 else float("nan")


def summary(rows: list[dict], honest: list[int], diligent: int) -> dict:
    """Per-run figures from the per-window LossScores (uid → score)."""
    pairs = [(r["scores"][diligent], statistics.mean(r["scores"][u] for u in honest)) for r in rows]
    total_d, total_h = sum(d for d, _ in pairs), sum(h for _, h in pairs)
    return {"ratio_of_sums": total_d / total_h if total_h > 0 else float("nan"),
            "per_window": [round(d / h if h > 0 else float("nan"), 3) for d, h in pairs],
            "windows_won": sum(d > h for d, h in pairs),
            "windows": len(rows), "final_val_loss": rows[-1]["val_loss"] if rows else float("nan")}


def run_variant(spend: str, seed: int, windows: int, steps: int, honest: int, sequences: int) -> dict:
    """One simulated run: per window every peer's LossScore on a fixed random sample, then the engine's window."""
    import numpy as np

    from benchmarks.common import default_dataset, setup_worker
    from dso.config.schema import HParams
    from dso.training.outer import peer_norms, reference_norms
    from scoring.evaluation import ParameterSnapshot, random_losses, stepped_losses, update_step
    from sim.simulator import SimNet

    setup_worker()

    class Spending(SimNet):
        def inner_budget(self, batches: int) -> tuple[int, int]:
            if spend == "steps":
                return self.hp.batch_size, self.inner_steps * batches
            return self.hp.batch_size * batches, self.inner_steps

    hp = HParams(seed=seed)
    dataset = default_dataset(hp)
    net = Spending(hp, dataset, ["honest"] * honest + ["diligent"], inner_steps=steps)
    rand = dataset.unassigned(np.random.default_rng(seed), np.array([], dtype=np.int64), sequences)
    rows = []
    for t in range(windows):
        payloads, rejections = net.uploads(t)
        reference = reference_norms([peer_norms(net.codec, p.update) for p in payloads.values()], list(net.shapes))
        snapshot = ParameterSnapshot(net.model)
        base = random_losses(net.model, snapshot, None, rand, hp.micro_batch).base
        scores = {}
        for uid, payload in sorted(payloads.items()):
            step = update_step(net.codec, payload.update, hp, t, reference, net.shapes)
            assert isinstance(step, dict), step  # every peer here is honest or diligent
            stepped = stepped_losses(net.model, snapshot, step, [rand], hp.micro_batch)[0]
            scores[uid] = float(base.mean() - stepped.mean())  # LossScore
        record = net.conclude(t, payloads, rejections)
        rows.append({"window": t, "scores": scores, "val_loss": record.val_loss})
        print(f"[extra_compute] {spend}: window {t + 1}/{windows}, val {record.val_loss:.3f}, diligent/honest "
              f"{diligent_ratio(scores, list(range(1, honest + 1)), honest + 1):.2f}", file=sys.stderr, flush=True)
    return {"spend": spend, "seed": seed, "rows": rows,
            **summary(rows, list(range(1, honest + 1)), honest + 1)}


def markdown(results: list[dict], args: argparse.Namespace) -> str:
    lines = [f"# Twice the compute: more steps or larger steps ({args.honest} honest peers × {args.steps} steps of "
             f"batch_size, {args.windows} windows, {args.sequences} scoring sequences)", "",
             "| variant | seed | diligent / honest LossScore (sums) | windows won | per window | final val loss |",
             "|---|---|---:|---:|---|---:|"]
    for r in results:
        lines.append(f"| {r['spend']} | {r['seed']} | {r['ratio_of_sums']:.3f} | {r['windows_won']} of "
                     f"{r['windows']} | {', '.join(f'{x:.2f}' for x in r['per_window'])} | "
                     f"{r['final_val_loss']:.3f} |")
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: Path, title: str) -> None:
    """The diligent peer's LossScore over the honest mean, per window, one line per variant and seed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        ax.plot(range(1, len(r["per_window"]) + 1), r["per_window"], marker="o",
                label=f"{r['spend']} (seed {r['seed']}): {r['ratio_of_sums']:.2f} over the run")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    save_plot(fig, ax, path, "window", "diligent / honest mean LossScore", title)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10, help="an honest peer's inner steps per window")
    parser.add_argument("--honest", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--sequences", type=int, default=48, help="random sequences every update is scored on")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="runs/extra_compute")
    args = parser.parse_args(argv)
    started = time.time()
    with worker_pool(args.workers) as pool:
        futures = [pool.submit(run_variant, v, seed, args.windows, args.steps, args.honest, args.sequences)
                   for seed in range(args.seeds) for v in VARIANTS]
        results = [f.result() for f in as_completed(futures)]
    results.sort(key=lambda r: (r["seed"], VARIANTS.index(r["spend"])))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"settings": vars(args), "seconds": round(time.time() - started, 1),
              "results": [{k: v for k, v in r.items() if k != "rows"} | {"rows": [
                  {"window": row["window"], "val_loss": row["val_loss"],
                   "scores": {str(u): s for u, s in row["scores"].items()}} for row in r["rows"]]} for r in results]}
    (out / "extra_compute.json").write_text(json.dumps(report, indent=1))
    (out / "extra_compute.md").write_text(markdown(results, args))
    plot(results, out / "extra_compute.png", f"Twice the compute, H = {args.steps}: more steps or larger steps")
    print(markdown(results, args))
    return report


if __name__ == "__main__":
    main()
