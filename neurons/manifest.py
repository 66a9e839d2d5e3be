"""The run manifest: the leading validator's protocol settings and data hash, which other nodes must match."""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from dso.config import HParams
from dso.rejections import Rejection


def manifest(hp: HParams, data_hash: str) -> dict[str, Any]:
    return {"version": hp.protocol_version, "hparams_digest": hp.digest(), "data_hash": data_hash,
            "hparams": asdict(hp)}


def manifest_problem(mine: dict[str, Any], theirs: dict[str, Any] | Rejection) -> str | None:
    """Why this node must not join the run described by ``theirs`` (None = agree)."""
    if isinstance(theirs, Rejection):
        return None  # no manifest yet: nothing to disagree with
    if theirs.get("data_hash") and theirs.get("data_hash") != mine["data_hash"]:
        return (f"data hash {mine['data_hash'][:12]}… differs from the run's {str(theirs['data_hash'])[:12]}…: "
                "use the same corpus as the validator")
    if theirs.get("hparams_digest") != mine["hparams_digest"]:
        ours, other = mine["hparams"], theirs.get("hparams") if isinstance(theirs.get("hparams"), dict) else {}
        diff = _diff(ours, other)
        return f"hyper-parameters differ from the run's ({'; '.join(diff[:6]) or 'digest mismatch'})"
    return None


def _diff(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _diff(x, y, f"{prefix}{key}.")
        elif x != y:
            out.append(f"hparams.{prefix}{key}: ours {x!r}, run {y!r}")
    return out
