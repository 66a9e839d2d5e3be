"""In-process simulations (no S3, no chain processes): ``python scripts/simulate.py``, ``dso-simulate``.

    python scripts/simulate.py honest      [--peers 4] [--windows 30]  [--out runs/sim-honest]
    python scripts/simulate.py figure2     [--windows 20]              [--out runs/sim-figure2]
    python scripts/simulate.py adversaries [--windows 20]              [--out runs/sim-adversaries]

``honest``: N honest peers train the default model with the run's defaults (inner steps, the compressed
pseudo-gradient, the outer step); the validation loss falls (``report.json``, ``val_loss.png``).

``figure2``: the Gauntlet paper's Figure 2 — a baseline peer, a peer processing
2× data and a peer that pauses for 3 windows and then goes on from its own,
now 3 steps stale, model (as in the paper), scored by the real validator
code; plots LossScore and LossRating per window (``figure2.png``) and reports
the final LossRating order.

``adversaries``: 4 honest peers, a diligent one and one peer of every attack in
``sim/behaviours/`` (two sybils); reports each behaviour's weight share
per window and at the end (``shares.png``).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from dso.config.schema import HParams
from dso.data.corpus import DataError
from dso.data.dataset import Dataset
from sim.behaviours import BEHAVIOURS, GOOD
from sim.report import COLOURS
from sim.simulator import SimNet, WindowRecord, behaviour_shares
from sim.training import run_honest

FIGURE2_ROLES = ["honest", "diligent", "desync"]
FIGURE2_DESYNC = {4, 5, 6}
ADVERSARY_ROLES = ["honest"] * 4 + ["diligent"] + [b for b in BEHAVIOURS if b not in GOOD and b != "sybil"] + \
    ["sybil", "sybil"]


Record = dict[str, Any]  # one window of the simulation as a JSON object (WindowRecord.to_dict)


def _agg() -> None:
    """Plots go to files: the Agg backend, chosen before pyplot is imported."""
    import matplotlib

    matplotlib.use("Agg")


def plot_loss(path: Path, series: dict[str, list[dict[str, float]]], title: str) -> None:
    _agg()
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, rows in series.items():
        ax.plot([r["window"] for r in rows], [r["loss"] for r in rows], label=label)
    ax.set(xlabel="window", ylabel="validation loss (nats/byte)", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def dataset_for(hp: HParams, args: argparse.Namespace) -> Dataset:
    try:
        return Dataset.for_run(hp, args.corpus, args.cache_dir)
    except DataError as e:
        raise SystemExit(f"simulate: {e}") from None


def cmd_honest(args: argparse.Namespace, hp: HParams, out: Path) -> dict[str, Any]:
    ds = dataset_for(hp, args)
    print(f"simulate: {args.peers} honest peers, {args.windows} windows, data {ds.data_hash[:12]}")
    hist = run_honest(hp, ds, args.peers, args.windows,
                      on_window=lambda w, loss: print(f"window {w:3d}  val_loss {loss:.4f}", flush=True))
    plot_loss(out / "val_loss.png", {f"network, {hp.outer.rule} outer step": hist.rows()},
              f"{args.peers} honest peers, default model")
    print(f"simulate: validation loss {hist.val_loss[0]:.3f} → {hist.val_loss[-1]:.3f} in {hist.seconds:.0f}s")
    return {"peers": args.peers, "val_loss": hist.rows(), "seconds": hist.seconds, "data_hash": ds.data_hash}


def run_sim(hp: HParams, args: argparse.Namespace, roles: list[str], desync: set[int] | None = None) -> list[Record]:
    # The paper's desynchronised peer pauses for 3 windows, then goes on from its own model: it stays behind.
    net = SimNet(hp, dataset_for(hp, args), roles, desync_windows=desync, desync_stays_behind=desync is not None)

    def show(r: WindowRecord) -> None:
        shares = {k: round(v, 3) for k, v in behaviour_shares(roles, r.weights).items() if v}
        print(f"window {r.window:3d}  val_loss {r.val_loss:.4f}  evaluated {sorted(r.loss_scores)}  "
              f"shares {shares}  {r.seconds:.1f}s", flush=True)

    return [r.to_dict() for r in net.run(args.windows, show)]


def plot_figure2(records: list[Record], names: dict[str, str], path: Path) -> None:
    """LossScore (as the gap to the window's mean, since all scores shrink together as the model learns)
    and LossRating per window, one line per peer."""
    _agg()
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    windows = [r["window"] for r in records]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for uid, role in names.items():
        gaps = []
        for r in records:
            scores = r["loss_scores"]
            mean = sum(scores.values()) / len(scores) if scores else float("nan")
            gaps.append(scores[uid] - mean if uid in scores else float("nan"))
        axes[0].plot(windows, gaps, marker=".", color=COLOURS[role], label=role)
        axes[1].plot(windows, [r["ratings"].get(uid, float("nan")) for r in records], color=COLOURS[role],
                     label=role)
    for ax in axes:
        ax.axvspan(min(FIGURE2_DESYNC) - 0.5, max(FIGURE2_DESYNC) + 0.5, color="#e08214", alpha=0.12)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set(xlabel="window", ylabel="LossScore − mean of the window", title="LossScore per window (δ_rand)")
    axes[1].set(xlabel="window", ylabel="LossRating (μ − z·σ)", title="LossRating per window")
    fig.suptitle("Baseline, 2× data and desynchronised (shaded: paused; it stays 3 windows behind afterwards)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cmd_figure2(args: argparse.Namespace, hp: HParams, out: Path) -> dict[str, Any]:
    hp.eval_peers = len(FIGURE2_ROLES)  # every peer evaluated every window, as in the paper's simulation
    records = run_sim(hp, args, FIGURE2_ROLES, FIGURE2_DESYNC)
    names = {str(i + 1): role for i, role in enumerate(FIGURE2_ROLES)}
    final = {names[u]: r for u, r in records[-1]["ratings"].items()}
    order = sorted(final, key=lambda name: final[name], reverse=True)
    plot_figure2(records, names, out / "figure2.png")
    print(f"simulate: final LossRating order {' > '.join(order)}")
    return {"roles": names, "desync_windows": sorted(FIGURE2_DESYNC), "final_ratings": final,
            "rating_order": order, "expected_order_holds": order == ["diligent", "honest", "desync"],
            "windows": records}


def plot_shares(windows: list[int], history: list[dict[str, float]], path: Path) -> None:
    _agg()
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for role in history[0]:
        ax.plot(windows, [h[role] for h in history], color=COLOURS[role], label=role)
    ax.set(xlabel="window", ylabel="weight share", title="Weight share per behaviour (simulated validator)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cmd_adversaries(args: argparse.Namespace, hp: HParams, out: Path) -> dict[str, Any]:
    roles = ADVERSARY_ROLES
    records = run_sim(hp, args, roles)
    history = [behaviour_shares(roles, {int(u): w for u, w in r["weights"].items()}) for r in records]
    plot_shares([r["window"] for r in records], history, out / "shares.png")
    final = history[-1]
    print("simulate: final weight shares " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in final.items()))
    return {"roles": {str(i + 1): r for i, r in enumerate(roles)}, "final_shares": final,
            "good_share": sum(v for k, v in final.items() if k in GOOD), "shares": history, "windows": records}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name, windows in (("honest", 30), ("figure2", 20), ("adversaries", 20)):
        p = sub.add_parser(name)
        p.add_argument("--windows", type=int, default=windows)
        p.add_argument("--seed", type=int, default=HParams().seed)
        p.add_argument("--corpus", default="shakespeare")
        p.add_argument("--cache-dir", default="~/.cache/dso")
        p.add_argument("--out", default=f"runs/sim-{name}")
        if name == "honest":
            p.add_argument("--peers", type=int, default=4)
    args = parser.parse_args(argv)
    if args.windows < 1:
        parser.error("--windows must be at least 1")
    torch.set_num_threads(1)
    hp = HParams(seed=args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"honest": cmd_honest, "figure2": cmd_figure2, "adversaries": cmd_adversaries}[args.cmd](args, hp, out)
    result.update(command="python scripts/simulate.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                  windows_run=args.windows, seed=args.seed)
    (out / "report.json").write_text(json.dumps(result, indent=2))
    print(f"simulate: report in {out}/report.json")
    return 0


def cli() -> None:
    """Console entry point ``dso-simulate``."""
    sys.exit(main())
