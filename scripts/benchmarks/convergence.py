"""Convergence section: validation loss after W windows, DeMo network against its ablations and AdamW.

Variants, all from the same initial model, on the same peers' assigned batches, same windows:

* ``demo`` (a): the honest network — DeMo (DCT, top-k, 4-bit values, error feedback), signed step;
* ``demo_fp32_values`` (a'): the same top-k with float32 values — is 4-bit quantisation free?;
* ``uncompressed`` (b): the same signed aggregation of dense updates (no DCT, no top-k);
* ``adamw`` (c): data-parallel AdamW, one step per window on the mean gradient of all peers'
  batches.  In full mode its learning rate is the best of a small sweep at the same horizon
  (every sweep curve is reported); DeMo's α is the protocol default, not tuned here.

``ratio`` = final loss (a) / final loss (c).  Runs are independent, so they share two worker
processes (one torch thread each).
"""
from __future__ import annotations

import math
from pathlib import Path

from benchmarks.common import ROOT, finite_or_none, save_plot, worker_pool

FULL = {"windows": 45, "peers": 4, "adamw_lrs": (2e-3, 4e-3, 8e-3), "steps_max": None}
QUICK = {"windows": 1, "peers": 2, "adamw_lrs": (2e-3,), "steps_max": 2}  # a smoke run: every variant, no figure
PLOT = ROOT / "docs" / "img" / "convergence.png"
TAIL = 5  # windows averaged for the (less noisy) tail comparison


def train_variant(kind: str, windows: int, peers: int, value_bits: int | None = None,
                  lr: float | None = None, steps_max: int | None = None) -> dict:
    """One training run (in a worker process): validation loss before training and after each window."""
    from benchmarks.common import default_dataset, setup_worker
    setup_worker()
    from dso.config.schema import HParams
    from sim.training import run_adamw, run_honest

    hp = HParams()
    if value_bits is not None:
        hp.value_bits = value_bits
    if steps_max is not None:
        hp.inner.steps_max = steps_max
    dataset = default_dataset(hp)
    if kind == "adamw":
        hist = run_adamw(hp, dataset, peers, windows, lr=lr)
    else:
        hist = run_honest(hp, dataset, peers, windows, compress=kind != "uncompressed")
    return {"val_loss": [finite_or_none(x) for x in hist.val_loss],
            "train_loss": [finite_or_none(x) for x in hist.train_loss], "seconds": hist.seconds}


def adamw_key(lr: float) -> str:
    return f"adamw_lr{lr:g}"


def final(curve: list[float | None]) -> float:
    """Last validation loss; a diverged run (None / non-finite) counts as infinitely bad."""
    x = curve[-1] if curve else None
    return x if x is not None and math.isfinite(x) else math.inf


def tail_mean(curve: list[float | None], n: int = TAIL) -> float:
    tail = curve[-n:]
    if not tail or any(x is None or not math.isfinite(x) for x in tail):
        return math.inf
    return sum(tail) / len(tail)


def pick_adamw(curves: dict[str, list], lrs) -> float:
    """The sweep's learning rate with the lowest final validation loss (first one on a tie)."""
    return min(lrs, key=lambda lr: final(curves[adamw_key(lr)]))


def summarise(curves: dict[str, list], lrs, windows: int, peers: int, tokens_per_window: int) -> dict:
    lr = pick_adamw(curves, lrs)
    a, a32, b, c = (curves[k] for k in ("demo", "demo_fp32_values", "uncompressed", adamw_key(lr)))
    ratio = lambda x, y: x / y if math.isfinite(x) and math.isfinite(y) and y else None  # noqa: E731
    return {
        "windows": windows, "peers": peers, "tokens_per_window": tokens_per_window,
        "demo": finite_or_none(final(a)), "demo_fp32_values": finite_or_none(final(a32)),
        "uncompressed": finite_or_none(final(b)), "adamw": finite_or_none(final(c)), "adamw_lr": lr,
        "adamw_sweep": {f"{x:g}": finite_or_none(final(curves[adamw_key(x)])) for x in lrs},
        "ratio": ratio(final(a), final(c)),
        "ratio_tail": ratio(tail_mean(a), tail_mean(c)),
        "ratio_vs_uncompressed": ratio(final(a), final(b)),
        "ratio_4bit_vs_fp32_values": ratio(final(a), final(a32)),
        "initial": finite_or_none(a[0]) if a else None,
    }


def plot(curves: dict[str, list], chosen: str, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {"demo": "(a) DeMo, 4-bit values", "demo_fp32_values": "(a') DeMo, float32 values",
              "uncompressed": "(b) signed, uncompressed", chosen: f"(c) AdamW, lr {chosen.removeprefix('adamw_lr')}"}
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    sweep_styles = iter([(0, (1, 1)), (0, (4, 2)), (0, (6, 2, 1, 2)), (0, (2, 3))] * 4)
    finite = [y for curve in curves.values() for y in curve if y is not None]
    for key, curve in curves.items():
        xs = [i for i, y in enumerate(curve) if y is not None]
        ys = [y for y in curve if y is not None]
        if key in labels:
            ax.plot(xs, ys, label=labels[key], linewidth=1.6)
        else:
            ax.plot(xs, ys, linestyle=next(sweep_styles), linewidth=1, color="0.45",
                    label=f"AdamW sweep, lr {key.removeprefix('adamw_lr')}")
    if finite:  # loss spikes above the starting loss are clipped; the JSON has every value
        start = curves["demo"][0] if curves.get("demo") and curves["demo"][0] is not None else max(finite)
        ax.set_ylim(min(finite) - 0.1, start + 0.2)
    save_plot(fig, ax, path, "windows completed", "validation loss (nats/byte, clipped at the start value)",
              "Convergence: DeMo network vs. ablations and AdamW")


def run(quick: bool) -> dict:
    from dso.config.schema import HParams

    cfg = QUICK if quick else FULL
    w, n, steps = cfg["windows"], cfg["peers"], cfg["steps_max"]
    jobs = {"demo": ("demo", w, n, None, None, steps), "demo_fp32_values": ("demo", w, n, 32, None, steps),
            "uncompressed": ("uncompressed", w, n, None, None, steps)}
    jobs.update({adamw_key(lr): ("adamw", w, n, None, lr, steps) for lr in cfg["adamw_lrs"]})
    with worker_pool(2) as pool:
        futures = {name: pool.submit(train_variant, *args) for name, args in jobs.items()}
        runs = {name: f.result() for name, f in futures.items()}
    curves = {name: r["val_loss"] for name, r in runs.items()}
    hp = HParams()
    out = summarise(curves, cfg["adamw_lrs"], w, n, n * hp.batch_size * hp.model.seq_len)
    out["seconds"] = {name: r["seconds"] for name, r in runs.items()}
    out["curves"] = curves
    if not quick:
        plot(curves, adamw_key(out["adamw_lr"]), PLOT)
        out["plot"] = str(PLOT.relative_to(ROOT))
    return out


def markdown(result: dict) -> str:
    def f(x):
        return "diverged" if x is None else f"{x:.4f}"
    lines = [f"{result['windows']} windows, {result['peers']} peers, {result['tokens_per_window']} tokens per window; "
             f"validation loss at start {f(result['initial'])}", "",
             "| run | final validation loss |", "|---|---:|",
             f"| (a) DeMo, 4-bit values | {f(result['demo'])} |",
             f"| (a') DeMo, float32 values | {f(result['demo_fp32_values'])} |",
             f"| (b) signed, uncompressed | {f(result['uncompressed'])} |",
             f"| (c) AdamW, lr {result['adamw_lr']:g} (sweep: "
             + ", ".join(f"{k}: {f(v)}" for k, v in result["adamw_sweep"].items()) + f") | {f(result['adamw'])} |",
             "", f"ratio (a)/(c) = {f(result['ratio'])} (last {TAIL} windows: {f(result['ratio_tail'])}); "
             f"(a)/(b) = {f(result['ratio_vs_uncompressed'])}; (a)/(a') = {f(result['ratio_4bit_vs_fp32_values'])}"]
    return "\n".join(lines)
