"""Benchmark sections: name → run(quick) -> dict; plus the Markdown rendering of a result."""
from __future__ import annotations

from benchmarks import codec

SECTIONS = {
    "codec": codec.run,
}


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def markdown(result: dict) -> str:
    lines = ["| section | metric | value |", "|---|---|---|"]
    for section, body in result.items():
        if not isinstance(body, dict) or section == "machine":
            continue
        for key, value in body.items():
            if isinstance(value, dict):
                for sub, v in value.items():
                    if not isinstance(v, (dict, list)):
                        lines.append(f"| {section} | {key}.{sub} | {_fmt(v)} |")
            elif isinstance(value, list):
                lines.append(f"| {section} | {key} | {', '.join(_fmt(x) for x in value)} |")
            else:
                lines.append(f"| {section} | {key} | {_fmt(value)} |")
    return "\n".join(lines)
