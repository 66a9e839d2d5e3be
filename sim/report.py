"""A run's report: report.json, report.md, PNG plots and one self-contained report.html, built from the
leading validator's per-window lines.

``report.json`` holds ``windows``, ``val_loss`` ([{window, loss}], nats per token) and ``peers``
([{uid, name, behaviour, weight, weight_mean, rejections}]) where ``weight`` is
the last weight vector the leading validator posted on chain, normalised to sum
1 over peers, ``weight_mean`` the mean of its per-window weights, and
``rejections`` counts reasons.  ``summary`` adds the shares the acceptance
criteria speak about.  An optional ``samples`` list ([{window, prompt, text}])
holds text sampled from the model; report.html shows it (sim/report_html.py).
Training figures: ``final_val_bits_per_byte``, ``unigram_bits_per_byte`` (the corpus's
token-unigram entropy per byte: what a model that knows only token frequencies scores; a line on the
validation-loss plot), ``tokens`` (training tokens the miners processed, from their JSON lines) and
``miner_utilisation`` (uid → mean inner-training seconds ÷ window seconds of each honest or diligent
miner, over its windows after the one it joined in; ``summary.miner_utilisation_mean`` is their mean,
``summary.miner_utilisation_mean_all_windows`` the same with the joining window), and ``reference_adamw`` /
``reference_final_bits_per_byte``: a centralised AdamW run on the tokens the honest and diligent
miners trained on (sim/reference.py), a curve on the validation-loss plot placed on the window axis
where the network had processed as many tokens.  ``data_source`` (written by the local network): where every
node read the corpus, the dataset bucket's ``s3://`` URL (or the local shard folder with ``--data.local``).

    python -m sim.report REPORT_JSON [--command CMD]   # render md, PNGs and html again from a report.json
"""
from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from sim import agreement
from sim.agreement import JSONLine
from sim.behaviours import GOOD
from sim.report_schema import MinerFigures, PeerRow, Report, Summary, ValPoint

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from dso.data.dataset import Dataset

COLOURS = {"honest": "#2b8cbe", "diligent": "#1a9850", "freerider": "#fdae61", "absent": "#bdbdbd",
           "noise": "#d73027", "scaler": "#f46d43", "signflip": "#a50026", "copier": "#762a83", "sybil": "#9970ab",
           "desync": "#e08214", "late": "#8c510a", "malformed": "#4d4d4d", "alie": "#c51b7d", "ipm": "#de77ae",
           "gamer": "#35978f"}


def unigram_bits_per_byte(counts: npt.ArrayLike, token_bytes: npt.ArrayLike) -> float:
    """Entropy of the token unigram distribution in bits per byte of text: ``H = −Σ p·log2 p`` bits per
    token (p = count / total) times tokens ÷ bytes, where a token of id i stands for ``token_bytes[i]``
    bytes.  With one byte per token it is the byte unigram entropy."""
    freq = np.asarray(counts, dtype=np.float64)
    sizes = np.asarray(token_bytes, dtype=np.float64)[:freq.size]
    tokens, nbytes = freq.sum(), float((freq * sizes).sum())
    if tokens <= 0 or nbytes <= 0:
        raise ValueError("unigram entropy needs at least one token of at least one byte")
    p = freq[freq > 0] / tokens
    return float(-(p * np.log2(p)).sum() * tokens / nbytes)


def corpus_unigram_bits_per_byte(dataset: Dataset, max_sequences: int = 20_000, block: int = 1024) -> float:
    """:func:`unigram_bits_per_byte` of a data set's token counts: every sequence (or ``max_sequences``
    evenly spaced ones of a larger corpus), read in blocks."""
    n = dataset.n_sequences
    rows = np.arange(n) if n <= max_sequences else np.unique(np.linspace(0, n - 1, max_sequences).astype(np.int64))
    sizes = np.asarray(dataset.tokenizer.token_bytes)
    counts = np.zeros(sizes.size, dtype=np.int64)
    for start in range(0, rows.size, block):
        ids = dataset.rows(rows[start:start + block]).reshape(-1)
        counts += np.bincount(ids, minlength=sizes.size)[:sizes.size]
    return unigram_bits_per_byte(counts, sizes)


def miner_figures(miners: Mapping[int, Sequence[JSONLine]],
                  peers: Mapping[int, tuple[str, str]]) -> dict[int, MinerFigures]:
    """uid → {utilisation, utilisation_all_windows, tokens (sum), windows} from miners' JSON lines.

    ``utilisation`` is the mean over the miner's window records after its first: the first window a miner
    works in began before the miner did (it started, then waited for θ), so it cannot fill it.  The mean over
    every record is kept beside it (``utilisation_all_windows``)."""
    out: dict[int, MinerFigures] = {}
    for uid, lines in miners.items():
        records = sorted((x for x in lines if isinstance(x.get("utilisation"), (int, float))),
                         key=lambda x: x.get("window", 0))
        if uid not in peers or not records:
            continue
        whole = records[1:] or records
        out[uid] = {"utilisation": sum(float(x["utilisation"]) for x in whole) / len(whole),
                    "utilisation_all_windows": sum(float(x["utilisation"]) for x in records) / len(records),
                    "tokens": sum(int(x.get("tokens") or 0) for x in records), "windows": len(records)}
    return out


def build(lines: Sequence[JSONLine], peers: Mapping[int, tuple[str, str]], posted: Mapping[int, float] | None,
          validators: Mapping[str, Sequence[JSONLine]] | None = None,
          miners: Mapping[int, Sequence[JSONLine]] | None = None, unigram_bpb: float | None = None) -> Report:
    """``lines``: the leading validator's JSON lines; ``peers``: uid → (name, behaviour);
    ``posted``: its last weights on chain (uid → weight), None when it never posted; ``validators``: every
    validator's lines, when there are several (their agreement and the leader hand-overs); ``miners``:
    uid → that miner's JSON lines; ``unigram_bpb``: the corpus's unigram entropy in bits per byte."""
    per_window: list[dict[int, float]] = [{int(u): w for u, w in line.get("weights", {}).items()} for line in lines]
    last: Mapping[int, float] = posted if posted else (per_window[-1] if per_window else {})
    total = sum(last.get(u, 0.0) for u in peers) or 1.0
    rejections: dict[int, Counter[str]] = {u: Counter() for u in peers}
    for line in lines:
        for uid, reason in line.get("rejections", {}).items():
            if int(uid) in rejections:
                rejections[int(uid)][reason] += 1
    work = miner_figures(miners or {}, peers)
    rows: list[PeerRow] = []
    for uid, (name, behaviour) in sorted(peers.items()):
        history = [w.get(uid, 0.0) for w in per_window]
        row: PeerRow = {"uid": uid, "name": name, "behaviour": behaviour, "weight": last.get(uid, 0.0) / total,
                        "weight_mean": sum(history) / len(history) if history else 0.0,
                        "rejections": dict(rejections[uid])}
        own = work.get(uid)
        rows.append(row if own is None else {**row, **own})
    val = [ValPoint(window=line["window"], loss=line["val_loss"],
                    bits_per_byte=line.get("val_bits_per_byte", math.nan)) for line in lines]
    utilisation = {str(u): round(f["utilisation"], 4) for u, f in sorted(work.items()) if peers[u][1] in GOOD}
    final_bpb = val[-1]["bits_per_byte"] if val else None
    report: Report = {
        "windows": len(lines), "val_loss": val, "peers": rows,
        "summary": summarise(rows, val, work, utilisation),
        "final_val_bits_per_byte": final_bpb if final_bpb is not None and math.isfinite(final_bpb) else None,
        "unigram_bits_per_byte": unigram_bpb,
        "tokens": sum(f["tokens"] for f in work.values()) if work else None,
        "miner_utilisation": utilisation,
        "history": {"weights": [{str(u): w for u, w in pw.items()} for pw in per_window],
                    "ratings": [line.get("loss_ratings", {}) for line in lines],
                    "windows": [line["window"] for line in lines]}}
    if validators and len(validators) > 1:
        report["validators"] = agreement.weight_agreement(validators)
        honest = {peers[u][0]: ls for u, ls in (miners or {}).items() if u in peers and peers[u][1] in GOOD}
        report["validators"]["miner_sync"] = agreement.miner_sync(validators, honest)
    return report


def add_reference(report: Report, reference: Mapping[str, Any] | None, per_window: dict[int, int]) -> None:
    """Put the centralised AdamW reference curve (sim/reference.py) into the report, placed on the window
    axis where the network had processed as many tokens."""
    from sim.reference import on_windows

    if not reference or not reference.get("val_loss"):
        return
    report["reference_adamw"] = {**reference, "windows": on_windows(reference["tokens"], per_window)}
    last = reference["bits_per_byte"][-1]
    report["reference_final_bits_per_byte"] = last if math.isfinite(last) else None


def summarise(rows: Sequence[PeerRow], val: Sequence[ValPoint], work: Mapping[int, MinerFigures] | None = None,
              utilisation: Mapping[str, float] | None = None) -> Summary:
    good = sum(r["weight"] for r in rows if r["behaviour"] in GOOD)
    adversaries = [r for r in rows if r["behaviour"] not in GOOD]
    honest = [r["weight"] for r in rows if r["behaviour"] == "honest"]
    diligent = [r["weight"] for r in rows if r["behaviour"] == "diligent"]
    return {
        "good_share": good,
        "max_adversary_share": max((r["weight"] for r in adversaries), default=0.0),
        "honest_mean": sum(honest) / len(honest) if honest else 0.0,
        "diligent_mean": sum(diligent) / len(diligent) if diligent else None,
        "val_loss_first": val[0]["loss"] if val else None,
        "val_loss_last": val[-1]["loss"] if val else None,
        "val_bits_per_byte_first": val[0]["bits_per_byte"] if val else None,
        "val_bits_per_byte_last": val[-1]["bits_per_byte"] if val else None,
        "tokens": sum(f["tokens"] for f in work.values()) if work else None,
        "miner_utilisation_mean": sum(utilisation.values()) / len(utilisation) if utilisation else None,
        "miner_utilisation_min": min(utilisation.values()) if utilisation else None,
        "miner_utilisation_mean_all_windows": _mean([f["utilisation_all_windows"] for u, f in (work or {}).items()
                                                     if str(u) in (utilisation or {})]),
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def markdown(report: Report, command: str = "") -> str:
    s = report["summary"]
    out = ["# Local network run", ""]
    if command:
        out += [f"Command: `{command}`", ""]
    first, last = s["val_loss_first"], s["val_loss_last"]
    out += [f"- windows: {report['windows']}",
            f"- validation loss: {first:.4f} → {last:.4f} nats/token "
            f"({s['val_bits_per_byte_first']:.3f} → {s['val_bits_per_byte_last']:.3f} bits/byte)"
            if first is not None else "- validation loss: n/a",
            f"- honest + diligent weight: {100 * s['good_share']:.1f}%",
            f"- largest adversary weight: {100 * s['max_adversary_share']:.2f}%",
            f"- honest mean weight: {100 * s['honest_mean']:.1f}%"
            + (f", diligent mean: {100 * s['diligent_mean']:.1f}%" if s["diligent_mean"] is not None else "")]
    if report.get("unigram_bits_per_byte") is not None:
        out.append(f"- the corpus's unigram entropy: {report['unigram_bits_per_byte']:.3f} bits/byte "
                   "(a model that knows only token frequencies)")
    if s.get("tokens") is not None:
        out.append(f"- training tokens the miners processed: {s['tokens']:,}")
    if report.get("data_source"):
        out.append(f"- training data read by every node from `{report['data_source']}`")
    ref = report.get("reference_adamw")
    if ref and report.get("reference_final_bits_per_byte") is not None:
        cut = "" if ref["complete"] else f" (cut short at {ref['tokens'][-1]:,} tokens by its time limit)"
        out.append(f"- centralised AdamW on the {ref['target_tokens']:,} tokens the honest and diligent miners "
                   f"trained on ({ref['steps']} steps of {ref['batch_sequences']} sequences, lr {ref['lr']:g}): "
                   f"{report['reference_final_bits_per_byte']:.3f} bits/byte{cut}")
    out += _utilisation_line(s)
    out += ["", "| uid | name | behaviour | weight | mean weight | rejections |", "|---:|---|---|---:|---:|---|"]
    for r in report["peers"]:
        rej = ", ".join(f"{k} {v}" for k, v in sorted(r["rejections"].items())) or "—"
        out.append(f"| {r['uid']} | {r['name']} | {r['behaviour']} | {100 * r['weight']:.2f}% | "
                   f"{100 * r['weight_mean']:.2f}% | {rej} |")
    if report.get("validators"):
        out += [""] + agreement.markdown(report["validators"])
    for sample in report.get("samples") or []:
        out += ["", f"Sampled text (window {sample.get('window', '?')}, prompt {sample.get('prompt', '')!r}):", "",
                "```", f"{sample.get('prompt', '')}{sample.get('text', '')}", "```"]
    out += ["", "![validation loss](val_loss.png)", "", "![weights](weights.png)", "", "![ratings](ratings.png)", "",
            "The same report with every plot and table in one page: [report.html](report.html).", ""]
    return "\n".join(out)


def _utilisation_line(s: Summary) -> list[str]:
    mean, low = s.get("miner_utilisation_mean"), s.get("miner_utilisation_min")
    if mean is None or low is None:
        return []
    every = s.get("miner_utilisation_mean_all_windows")
    return [f"- miner utilisation (inner training ÷ window, honest and diligent miners, after the window each "
            f"joined in): mean {100 * mean:.1f}%, lowest {100 * low:.1f}%"
            + (f" (mean {100 * every:.1f}% with the joining window)" if every is not None else "")]


PLOTS = {"val_loss": "Validation loss of the shared model", "weights": "Weight per peer (validator)",
         "ratings": "LossRating per peer"}


def bits_per_nat(report: Report) -> float:
    """Bits per byte for one nat per token on the run's validation batch (fixed for a run: its tokens and
    the bytes they stand for do not change), from the recorded figures."""
    ratios = [v["bits_per_byte"] / v["loss"] for v in report["val_loss"]
              if math.isfinite(v.get("bits_per_byte", math.nan)) and v["loss"]]
    return ratios[-1] if ratios else 1 / math.log(2)


def figures(report: Report) -> dict[str, Figure]:
    """name → matplotlib Figure of every plot in :data:`PLOTS` (the caller saves and closes them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out: dict[str, Figure] = {}
    windows = report["history"]["windows"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([v["window"] for v in report["val_loss"]], [v["loss"] for v in report["val_loss"]], marker=".",
            label="shared model")
    ax.set(xlabel="window", ylabel="validation loss (nats/token)", title=PLOTS["val_loss"])
    ratio = bits_per_nat(report)
    ref = report.get("reference_adamw")
    if ref and ref.get("windows"):
        ax.plot(ref["windows"], ref["val_loss"], color="#1a9850", linewidth=1, label="centralised AdamW, same tokens")
    unigram = report.get("unigram_bits_per_byte")
    if isinstance(unigram, (int, float)) and math.isfinite(unigram) and ratio > 0:
        ax.axhline(unigram / ratio, color="grey", linestyle="--", linewidth=1,
                   label=f"corpus unigram entropy ({unigram:.2f} bits/byte)")
    if len(ax.get_lines()) > 1:
        ax.legend(fontsize=8)
    bpb = ax.secondary_yaxis("right", functions=(lambda nats: np.multiply(nats, ratio),
                                                 lambda bits: np.divide(bits, ratio)))
    bpb.set_ylabel("bits/byte")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out["val_loss"] = fig

    panels: tuple[tuple[Literal["weights", "ratings"], str], ...] = (
        ("weights", "weight share"), ("ratings", "LossRating (μ − z·σ)"))
    for key, ylabel in panels:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        seen: set[str] = set()
        for r in report["peers"]:
            ys = [h.get(str(r["uid"]), 0.0) for h in report["history"][key]]
            label = r["behaviour"] if r["behaviour"] not in seen else None
            seen.add(r["behaviour"])
            ax.plot(windows, ys, color=COLOURS.get(r["behaviour"], "black"), label=label, alpha=0.85)
        ax.set(xlabel="window", ylabel=ylabel, title=PLOTS[key])
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if seen:
            ax.legend(fontsize=8, ncol=2)
        fig.tight_layout()
        out[key] = fig
    return out


def plot(report: Report, out: Path) -> None:
    import matplotlib.pyplot as plt

    for name, fig in figures(report).items():
        fig.savefig(out / f"{name}.png", dpi=120)
        plt.close(fig)


def write(report: Report, out: Path, command: str = "") -> None:
    from sim.report_html import write_html

    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    (out / "report.md").write_text(markdown(report, command))
    plot(report, out)
    write_html(report, out / "report.html", command)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sim.report", description="Render report.md, the PNG plots and "
                                "report.html again from a report.json (into its folder).")
    p.add_argument("report_json", type=Path)
    p.add_argument("--command", default="", help="the command that made the run (shown in the report)")
    args = p.parse_args(argv)
    try:
        report = json.loads(args.report_json.read_text())
    except (OSError, ValueError) as e:
        p.error(f"{args.report_json}: {e}")
    write(report, args.report_json.parent, args.command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
