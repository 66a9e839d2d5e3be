"""The run manifest: the leading validator's run id, protocol settings and data hash.

The run id scopes every protocol object of the run (storage/keys.py): a node learns it here, and a node
whose settings or data differ from the run's refuses to join."""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from dso.config.schema import HParams
from dso.protocol.rejections import Reason, Rejection
from storage.keys import is_run_id


def manifest(hp: HParams, data_hash: str, run: str = "", genesis_window: int = 0) -> dict[str, Any]:
    return {"version": hp.protocol_version, "hparams_digest": hp.digest(), "data_hash": data_hash,
            "hparams": asdict(hp), "run": run, "genesis_window": genesis_window}


def run_of(theirs: dict[str, Any] | Rejection) -> str | Rejection:
    """The run id a published manifest names."""
    if isinstance(theirs, Rejection):
        return theirs
    run = theirs.get("run")
    return run if is_run_id(run) else Rejection(Reason.MALFORMED, f"manifest run id {str(run)[:32]!r}")


def manifest_problem(mine: dict[str, Any], theirs: dict[str, Any] | Rejection) -> str | None:
    """Why this node must not join the run described by ``theirs`` (None = agree)."""
    if isinstance(theirs, Rejection):
        return None  # no manifest yet: nothing to disagree with
    if theirs.get("data_hash") and theirs.get("data_hash") != mine["data_hash"]:
        return (f"data hash {mine['data_hash'][:12]}… differs from the run's {str(theirs['data_hash'])[:12]}…: "
                "use the same corpus as the validator")
    if theirs.get("hparams_digest") != mine["hparams_digest"]:
        other = theirs.get("hparams")
        diff = _diff(mine["hparams"], other if isinstance(other, dict) else {})
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
