"""The run report as one self-contained HTML page: summary, plots, peers, rejections and sampled text.

Everything is inside the file — plots are SVG data URIs (each its own document, so their ids never
clash), the style sheet is inline, there is no script and nothing is fetched — so it opens anywhere,
mails as one attachment and renders the same offline.  Every string from the run is HTML-escaped.

The "Sampled text" section shows ``report["samples"]`` when the report carries it: a list of
``{"window": int, "prompt": str, "text": str}`` (text the model wrote); until something fills it the
section says so.
"""
from __future__ import annotations

import base64
import html
import io
import math
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.report import PLOTS, figures
from sim.report_schema import Report

if TYPE_CHECKING:
    from matplotlib.figure import Figure

STYLE = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2330; margin: 0;
       background: #f6f7f9; }
main { max-width: 1080px; margin: 0 auto; padding: 24px 28px 48px; background: #fff; }
h1 { font-size: 26px; margin: 0 0 4px; } h2 { font-size: 19px; margin: 32px 0 10px; border-bottom: 1px solid #e3e6ea; }
code { background: #f0f2f5; padding: 1px 5px; border-radius: 3px; font-size: 13px; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 16px 0; }
.card { flex: 1 1 180px; border: 1px solid #e3e6ea; border-radius: 6px; padding: 10px 14px; }
.card b { display: block; font-size: 21px; } .card span { color: #5a6270; font-size: 13px; }
table { border-collapse: collapse; width: 100%; font-size: 14px; }
th, td { padding: 5px 9px; border-bottom: 1px solid #eceef1; text-align: left; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.adversary td { color: #7a3b3b; } .swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; }
figure { margin: 14px 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eceef1; }
pre.sample { white-space: pre-wrap; background: #f8f8f6; border-left: 3px solid #2b8cbe; padding: 8px 12px; }
.muted { color: #6b7380; }
"""


def svg_data_uri(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="svg")
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _loss(nats: float | None, bits: float | None) -> str:
    if nats is None or not math.isfinite(nats):
        return "n/a"
    return f"{nats:.4f} nats/token" + (f" · {bits:.3f} bits/byte" if bits is not None and math.isfinite(bits) else "")


def _cards(report: Report) -> str:
    s = report["summary"]
    cards = [("windows", str(report["windows"])),
             ("validation loss, first", _loss(s["val_loss_first"], s.get("val_bits_per_byte_first"))),
             ("validation loss, last", _loss(s["val_loss_last"], s.get("val_bits_per_byte_last"))),
             ("honest + diligent weight", f"{100 * s['good_share']:.1f}%"),
             ("largest adversary weight", f"{100 * s['max_adversary_share']:.2f}%"),
             ("honest mean weight", f"{100 * s['honest_mean']:.1f}%")]
    diligent = s.get("diligent_mean")
    if diligent is not None:
        cards.append(("diligent mean weight", f"{100 * diligent:.1f}%"))
    if report.get("unigram_bits_per_byte") is not None:
        cards.append(("corpus unigram entropy", f"{report['unigram_bits_per_byte']:.3f} bits/byte"))
    if s.get("tokens") is not None:
        cards.append(("training tokens processed", f"{s['tokens']:,}"))
    if report.get("reference_final_bits_per_byte") is not None:
        cut = "" if report["reference_adamw"].get("complete") else " (cut short)"
        bits = report["reference_final_bits_per_byte"]
        cards.append(("centralised AdamW, same tokens", f"{bits:.3f} bits/byte{cut}"))
    mean, low = s.get("miner_utilisation_mean"), s.get("miner_utilisation_min")
    if mean is not None and low is not None:
        cards.append(("miner utilisation, mean (lowest)", f"{100 * mean:.1f}% ({100 * low:.1f}%)"))
    return '<div class="cards">' + "".join(f'<div class="card"><span>{_e(k)}</span><b>{_e(v)}</b></div>'
                                           for k, v in cards) + "</div>"


def _peers(report: Report) -> str:
    from sim.behaviours import GOOD
    from sim.report import COLOURS

    rows = []
    for r in report["peers"]:
        rej = ", ".join(f"{k} × {v}" for k, v in sorted(r["rejections"].items())) or "—"
        colour = COLOURS.get(r["behaviour"], "#000")
        rows.append(f'<tr class="{"" if r["behaviour"] in GOOD else "adversary"}"><td class="num">{_e(r["uid"])}'
                    f'</td><td>{_e(r["name"])}</td><td><span class="swatch" style="background:{_e(colour)}">'
                    f'</span> {_e(r["behaviour"])}</td><td class="num">{100 * r["weight"]:.2f}%</td>'
                    f'<td class="num">{100 * r["weight_mean"]:.2f}%</td><td>{_e(rej)}</td></tr>')
    return ('<table id="peers"><thead><tr><th class="num">uid</th><th>name</th><th>behaviour</th>'
            '<th class="num">final weight</th><th class="num">mean weight</th><th>rejections</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def _rejections(report: Report) -> str:
    """Reason × peer counts over the run (only peers and reasons that occur)."""
    peers = [r for r in report["peers"] if r["rejections"]]
    if not peers:
        return '<p class="muted" id="rejections">No peer input was rejected in this run.</p>'
    reasons = sorted({k for r in peers for k in r["rejections"]})
    totals: Counter[str] = Counter()
    for r in peers:
        totals.update(r["rejections"])
    head = "".join(f'<th class="num">{_e(k)}</th>' for k in reasons)
    body = "".join(f'<tr><td>{_e(r["name"])} (uid {_e(r["uid"])})</td>'
                   + "".join(f'<td class="num">{r["rejections"].get(k, "")}</td>' for k in reasons) + "</tr>"
                   for r in peers)
    foot = "".join(f'<td class="num"><b>{totals[k]}</b></td>' for k in reasons)
    return (f'<table id="rejections"><thead><tr><th>peer</th>{head}</tr></thead><tbody>{body}'
            f'<tr><td><b>all peers</b></td>{foot}</tr></tbody></table>')


def _samples(report: Report) -> str:
    samples = report.get("samples") or []
    if not samples:
        return ('<p class="muted" id="sampled-text">This report carries no sampled text (the run did not sample '
                'from the model).</p>')
    parts = []
    for s in samples:
        s = s if isinstance(s, dict) else {"text": s}
        head = f"window {_e(s['window'])}" if "window" in s else "sample"
        prompt = f' — prompt <code>{_e(s["prompt"])}</code>' if s.get("prompt") else ""
        parts.append(f'<h3>{head}{prompt}</h3><pre class="sample">{_e(s.get("text", ""))}</pre>')
    return '<div id="sampled-text">' + "".join(parts) + "</div>"


def _validators(report: Report) -> str:
    agreement = report.get("validators")
    if not agreement:
        return ""
    m = agreement["mean_l1_last"]
    figure = "—" if m is None else f"{m:.4f}"
    rows = "".join(f'<tr><td class="num">{p["window"]}</td><td class="num">{p["mean_l1"]:.4f}</td>'
                   f'<td>{_e(", ".join(agreement["leaders"].get(str(p["window"]), [])))}</td></tr>'
                   for p in agreement["per_window"])
    sync = agreement.get("miner_sync")
    in_sync = (f'<p id="miner-sync">bundles honest miners applied that gave their window\'s leader\'s model: '
               f'<b>{sync["in_sync"]} of {sync["applied"]}</b></p>') if sync else ""
    return (f'<h2>Validators</h2><p id="validator-agreement">{len(agreement["validators"])} validators; mean '
            f'pairwise L1 of their weight rows over the last {agreement["last_windows"]} windows: <b>{figure}</b> '
            f'(target ≤ {agreement["target"]})</p>{in_sync}'
            f'<table id="validators"><thead><tr><th class="num">window</th>'
            f'<th class="num">mean pairwise L1</th><th>leading</th></tr></thead><tbody>{rows}</tbody></table>')


def _plots(report: Report) -> str:
    import matplotlib.pyplot as plt

    parts = []
    for name, fig in figures(report).items():
        parts.append(f'<figure id="plot-{name}"><img alt="{_e(PLOTS[name])}" src="{svg_data_uri(fig)}"></figure>')
        plt.close(fig)
    return "".join(parts)


def render(report: Report, command: str = "") -> str:
    cmd = f"<p>Command: <code>{_e(command)}</code></p>" if command else ""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">'
            f"<title>DSO local network run — {report['windows']} windows</title><style>{STYLE}</style></head>"
            f"<body><main><h1>Local network run</h1>{cmd}{_cards(report)}"
            f"<h2>Plots</h2>{_plots(report)}<h2>Peers</h2>{_peers(report)}"
            f"<h2>Rejections</h2>{_rejections(report)}{_validators(report)}<h2>Sampled text</h2>{_samples(report)}"
            "</main></body></html>\n")


def write_html(report: Report, path: Path, command: str = "") -> None:
    Path(path).write_text(render(report, command), encoding="utf-8")
