#!/usr/bin/env python
"""In-process simulations (no S3, no chain processes).

    python scripts/simulate.py honest [--peers 4] [--windows 30] [--out runs/sim-honest]

``honest``: N honest peers train the default model on Shakespeare with DeMo
compression and signed aggregation; writes ``report.json`` and ``val_loss.png``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from dso.config import HParams  # noqa: E402
from dso.data import DataError, Dataset  # noqa: E402
from dso.simulation import run_honest  # noqa: E402


def plot_loss(path: Path, series: dict[str, list[dict]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
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


def cmd_honest(args: argparse.Namespace) -> int:
    hp = HParams(seed=args.seed)
    try:
        ds = Dataset.from_config(args.corpus, args.cache_dir, hp.model.seq_len, hp.seed, hp.val_fraction)
    except DataError as e:
        print(f"simulate: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"simulate: {args.peers} honest peers, {args.windows} windows, data {ds.data_hash[:12]}")
    hist = run_honest(hp, ds, args.peers, args.windows,
                      on_window=lambda w, loss: print(f"window {w:3d}  val_loss {loss:.4f}", flush=True))
    report = {"peers": args.peers, "windows": args.windows, "seed": args.seed, "data_hash": ds.data_hash,
              "val_loss": hist.rows(), "seconds": hist.seconds}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    plot_loss(out / "val_loss.png", {"DeMo, signed aggregation": hist.rows()},
              f"{args.peers} honest peers, default model")
    first, last = hist.val_loss[0], hist.val_loss[-1]
    print(f"simulate: validation loss {first:.3f} → {last:.3f} in {hist.seconds:.0f}s; report in {out}/")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    honest = sub.add_parser("honest", help="honest peers only: does the network learn?")
    honest.add_argument("--peers", type=int, default=4)
    honest.add_argument("--windows", type=int, default=30)
    honest.add_argument("--seed", type=int, default=HParams().seed)
    honest.add_argument("--corpus", default="shakespeare")
    honest.add_argument("--cache-dir", default="~/.cache/dso")
    honest.add_argument("--out", default="runs/sim-honest")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    return {"honest": cmd_honest}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
