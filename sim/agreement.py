"""How far several validators' weight rows are apart, and who led each window.

Pure functions over the validators' JSON lines (``window``, ``weights``, ``leading``): the report of a local
network with more than one validator shows them, and the three-validator end-to-end test checks the target.
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

TARGET_MEAN_L1 = 0.1   # mean pairwise L1 over the last windows (the protocol's target, docs/protocol.md)

JSONLine = Mapping[str, Any]  # one parsed JSON line of a node's log: read with .get, nothing assumed present


class WindowL1(TypedDict):
    window: int
    mean_l1: float


class MinerSync(TypedDict):
    applied: int
    in_sync: int
    forked: list[list[str | int]]  # [miner name, window] pairs (JSON arrays in report.json)


class _AgreementFigures(TypedDict):
    validators: list[str]
    per_window: list[WindowL1]
    last_windows: int
    mean_l1_last: float | None
    target: float
    met: bool
    leaders: dict[str, list[str]]  # window (as a JSON key) → the validators that reported leading it


class Agreement(_AgreementFigures, total=False):
    miner_sync: MinerSync  # added by the report when it has the miners' lines


def l1(a: Mapping[int, float], b: Mapping[int, float]) -> float:
    """L1 distance of two weight rows (a uid missing from one row weighs 0 there)."""
    return sum(abs(a.get(u, 0.0) - b.get(u, 0.0)) for u in set(a) | set(b))


def mean_pairwise_l1(rows: Sequence[Mapping[int, float]]) -> float:
    pairs = list(itertools.combinations(rows, 2))
    return sum(l1(a, b) for a, b in pairs) / len(pairs) if pairs else 0.0


def weighted_windows(by_validator: Mapping[str, Sequence[JSONLine]]) -> dict[int, dict[str, dict[int, float]]]:
    """window → validator → its row, for the windows every validator scored with some positive weight (rows of
    a cold start, all zero, agree trivially and would flatter the figure)."""
    rows = {name: {line["window"]: {int(u): float(w) for u, w in line.get("weights", {}).items()} for line in lines}
            for name, lines in by_validator.items()}
    common = set.intersection(*(set(r) for r in rows.values())) if rows else set()
    return {w: {name: r[w] for name, r in rows.items()} for w in sorted(common)
            if all(sum(r[w].values()) > 0 for r in rows.values())}


def weight_agreement(by_validator: Mapping[str, Sequence[JSONLine]], last: int = 10) -> Agreement:
    """Per-window mean pairwise L1 of the validators' rows, and its mean over the ``last`` such windows."""
    windows = weighted_windows(by_validator)
    per_window = [WindowL1(window=w, mean_l1=mean_pairwise_l1(list(rows.values()))) for w, rows in windows.items()]
    tail = per_window[-last:]
    mean_last = sum(p["mean_l1"] for p in tail) / len(tail) if tail else None
    leaders: dict[int, list[str]] = {}
    for name, lines in by_validator.items():
        for line in lines:
            if line.get("leading"):
                leaders.setdefault(line["window"], []).append(name)
    return {"validators": sorted(by_validator), "per_window": per_window, "last_windows": len(tail),
            "mean_l1_last": mean_last, "target": TARGET_MEAN_L1,
            "met": mean_last is not None and mean_last <= TARGET_MEAN_L1,
            "leaders": {str(w): names for w, names in sorted(leaders.items())}}


def miner_sync(by_validator: Mapping[str, Sequence[JSONLine]], miners: Mapping[str, Sequence[JSONLine]]) -> MinerSync:
    """Whether every bundle a miner applied gave the model of that window's leader (the validators that
    reported leading it): ``applied`` bundles, how many were ``in_sync``, and the ``forked`` (miner, window)s.
    A window nobody reported leading (its leader died in it) is not counted."""
    leader_hash: dict[int, set[str]] = {}
    for lines in by_validator.values():
        for line in lines:
            if line.get("leading") and line.get("model_hash"):
                leader_hash.setdefault(line["window"], set()).add(line["model_hash"])
    applied = 0
    forked: list[list[str | int]] = []
    for name, lines in sorted(miners.items()):
        for line in lines:
            hashes = leader_hash.get(line.get("window", -1))
            if hashes and str(line.get("aggregated", "")).startswith("applied"):
                applied += 1
                if line.get("model_hash") not in hashes:
                    forked.append([name, line["window"]])
    return {"applied": applied, "in_sync": applied - len(forked), "forked": forked}


def markdown(agreement: Agreement) -> list[str]:
    m = agreement["mean_l1_last"]
    out = ["## Validators", "",
           f"{len(agreement['validators'])} validators ({', '.join(agreement['validators'])}). Mean pairwise L1 "
           f"distance of their weight rows over the last {agreement['last_windows']} windows they all weighted: "
           + (f"**{m:.4f}** (target ≤ {agreement['target']}: {'met' if agreement['met'] else 'not met'})."
              if m is not None else "no window that all of them weighted."), ""]
    changes: list[str] = []
    previous: list[str] | None = None
    for window, names in agreement["leaders"].items():
        if names != previous:
            changes.append(f"window {window}: {', '.join(names)}")
            previous = names
    if changes:
        out += ["Leading validator (as each reported it), from: " + "; ".join(changes) + ".", ""]
    sync = agreement.get("miner_sync")
    if sync:
        forked = ", ".join(f"{name} in window {w}" for name, w in sync["forked"]) or "none"
        out += [f"Bundles the honest miners applied that gave their window's leader's model: **{sync['in_sync']} of "
                f"{sync['applied']}** (out of sync: {forked}).", ""]
    return out
