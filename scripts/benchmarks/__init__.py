"""Benchmark sections: name → module with ``run(quick) -> dict`` (and optionally ``markdown(result)``)."""
from __future__ import annotations

from benchmarks import (
    codec,
    convergence,
    data,
    device,
    gather,
    incentives,
    privacy,
    robust,
    scale,
    sketch,
    targets,
    training,
    validator,
)

MODULES = {
    "codec": codec,
    "validator": validator,
    "gather": gather,
    "sketch": sketch,
    "robust": robust,
    "data": data,
    "device": device,
    "scale": scale,
    "privacy": privacy,
    "incentives": incentives,
    "training": training,
    "convergence": convergence,  # last: the longest
}
SECTIONS = {name: module.run for name, module in MODULES.items()}


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def generic_markdown(body: dict) -> str:
    """Scalars (and one level of nested scalars) as a two-column table; long lists are left to the JSON."""
    lines = ["| metric | value |", "|---|---:|"]
    for key, value in body.items():
        if isinstance(value, dict):
            lines += [f"| {key}.{sub} | {_fmt(v)} |" for sub, v in value.items() if not isinstance(v, (dict, list))]
        elif not isinstance(value, list):
            lines.append(f"| {key} | {_fmt(value)} |")
    return "\n".join(lines)


def markdown(result: dict) -> str:
    out = []
    for name, body in result.items():
        if name not in MODULES or not isinstance(body, dict):
            continue
        out.append(f"### {name}\n")
        if "error" in body:
            out.append(f"failed: {body['error']}\n")
            continue
        render = getattr(MODULES[name], "markdown", generic_markdown)
        out.append(render(body) + "\n")
    if result.get("targets"):
        out += ["### targets\n", targets.markdown(result["targets"])]
    return "\n".join(out)
