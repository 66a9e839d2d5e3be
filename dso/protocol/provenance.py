"""Provenance ledger (ZIP-400 §6): one hash-linked record per applied round.

A record says which model the round started from and produced (``model_hash`` values), who
contributed with which score and aggregation weight, and the hash of the previous record.  Its
own hash is sha256 over canonical JSON (sorted keys, no whitespace, no NaN/inf) of every field
but ``record_hash``.  The validator publishes each record (its bucket, ``ledger/{window}-v{v}.json``,
and the chain's ledger); :func:`verify_chain` checks a whole chain, optionally against checkpoint
hashes.  Command line: ``python -m dso.protocol.provenance --records DIR [--checkpoints FILE]``.

Convention: ``checkpoint_hashes[w]`` is the model hash *after* round w was applied (the model a
checkpoint written at the end of window w holds).  Between records the model does not change.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

RECORD_VERSION = 1
GENESIS = ""  # prev_record_hash of the first record
_FIELDS = {"version", "window", "prev_model_hash", "new_model_hash", "contributors", "prev_record_hash",
           "validator", "extra", "record_hash"}
_CONTRIBUTOR_FIELDS = {"uid", "score", "weight", "contribution"}


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def record_hash(record: Mapping[str, Any]) -> str:
    """sha256 hex of the canonical JSON of the record without its ``record_hash`` field."""
    return hashlib.sha256(canonical_json({k: v for k, v in record.items() if k != "record_hash"})).hexdigest()


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _contributor(c: Mapping[str, Any]) -> dict[str, Any]:
    if set(c) != _CONTRIBUTOR_FIELDS:
        raise ValueError(f"contributor needs exactly the keys {sorted(_CONTRIBUTOR_FIELDS)}, got {sorted(c)}")
    uid = c["uid"]
    if isinstance(uid, bool) or not isinstance(uid, int) or uid < 0:
        raise ValueError(f"contributor uid must be an integer >= 0, got {uid!r}")
    for key in ("score", "weight", "contribution"):
        if not _number(c[key]):
            raise ValueError(f"contributor {uid}: {key} must be a finite number, got {c[key]!r}")
    return {"uid": uid, "score": float(c["score"]), "weight": float(c["weight"]),
            "contribution": float(c["contribution"])}


def make_record(window: int, prev_model_hash: str, new_model_hash: str, contributors: Sequence[Mapping[str, Any]],
                prev_record_hash: str, validator: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A record ready to publish (contributors sorted by uid, ``record_hash`` filled in).

    Raises ValueError on malformed input (it is the validator's own data: a bug, not an attack)."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be an integer >= 0, got {window!r}")
    for name, value in (("prev_model_hash", prev_model_hash), ("new_model_hash", new_model_hash),
                        ("prev_record_hash", prev_record_hash), ("validator", validator)):
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string")
    people = sorted((_contributor(c) for c in contributors), key=lambda c: c["uid"])
    if len({c["uid"] for c in people}) != len(people):
        raise ValueError("a uid appears twice among the contributors")
    record = {"version": RECORD_VERSION, "window": window, "prev_model_hash": prev_model_hash,
              "new_model_hash": new_model_hash, "contributors": people, "prev_record_hash": prev_record_hash,
              "validator": validator, "extra": dict(extra or {})}
    canonical_json(record["extra"])  # must be JSON without NaN/inf
    record["record_hash"] = record_hash(record)
    return record


def record_problems(record: Any) -> list[str]:
    """Schema and self-hash problems of one record (it may come from anyone's bucket)."""
    if not isinstance(record, dict):
        return ["record is not a JSON object"]
    if set(record) != _FIELDS:
        return [f"record keys {sorted(record)} differ from {sorted(_FIELDS)}"]
    where = f"record of window {record.get('window')!r}"
    problems = []
    if record["version"] != RECORD_VERSION:
        problems.append(f"{where}: unknown version {record['version']!r}")
    w = record["window"]
    if isinstance(w, bool) or not isinstance(w, int) or w < 0:
        problems.append(f"{where}: window must be an integer >= 0")
    for key in ("prev_model_hash", "new_model_hash", "prev_record_hash", "validator", "record_hash"):
        if not isinstance(record[key], str):
            problems.append(f"{where}: {key} must be a string")
    if not isinstance(record["extra"], dict):
        problems.append(f"{where}: extra must be an object")
    if not isinstance(record["contributors"], list):
        problems.append(f"{where}: contributors must be a list")
    else:
        uids: list[Any] = []  # JSON values; checked below
        for c in record["contributors"]:
            try:
                uids.append(_contributor(c)["uid"] if isinstance(c, dict) else None)
            except ValueError as exc:
                problems.append(f"{where}: {exc}")
        if None in uids:
            problems.append(f"{where}: a contributor is not an object")
        elif uids != sorted(set(uids)):
            problems.append(f"{where}: contributors must be sorted by uid without repeats")
    if not problems:
        try:
            if record_hash(record) != record["record_hash"]:
                problems.append(f"{where}: record_hash does not match its content")
        except ValueError as exc:
            problems.append(f"{where}: not canonical JSON ({exc})")
    return problems


def verify_chain(records: Sequence[Any], checkpoint_hashes: Mapping[int, str] | None = None,
                 start_hash: str = GENESIS) -> list[str]:
    """Every problem of a chain of records given oldest first; an empty list means it verifies.

    Checks each record's schema and hash, the link to the previous record (the first links to
    ``start_hash``), strictly increasing windows, model continuity (new hash of one record = previous
    hash of the next) and, for every checkpoint window, that the model hash after the latest round at
    or before it (or the chain's starting model, before the first round) equals the checkpoint's."""
    problems: list[str] = []
    good: list[dict[str, Any]] = []
    for i, record in enumerate(records):
        own = record_problems(record)
        if own:
            problems.extend(f"#{i}: {p}" for p in own)
            continue
        if good:
            prev = good[-1]
            if record["window"] <= prev["window"]:
                problems.append(f"#{i}: window {record['window']} does not follow window {prev['window']}")
            if record["prev_record_hash"] != prev["record_hash"]:
                problems.append(f"#{i}: window {record['window']} does not link to the record of window "
                                f"{prev['window']}")
            if record["prev_model_hash"] != prev["new_model_hash"]:
                problems.append(f"#{i}: window {record['window']} starts from model {record['prev_model_hash'][:12]}"
                                f"… but window {prev['window']} produced {prev['new_model_hash'][:12]}…")
        elif i == 0 and record["prev_record_hash"] != start_hash:
            problems.append(f"#0: first record links to {record['prev_record_hash'][:12]!r}, expected "
                            f"{start_hash[:12]!r}")
        good.append(record)
    if problems or not checkpoint_hashes:
        return problems
    for window in sorted(checkpoint_hashes):
        before = [r for r in good if r["window"] <= window]
        if before:
            expected, source = before[-1]["new_model_hash"], f"round {before[-1]['window']}"
        elif good:
            expected, source = good[0]["prev_model_hash"], "the chain's starting model"
        else:
            continue
        if checkpoint_hashes[window] != expected:
            problems.append(f"checkpoint of window {window} has model {str(checkpoint_hashes[window])[:12]}… but "
                            f"{source} gives {expected[:12]}…")
    return problems


# ------------------------------------------------------------------ CLI
def load_records(path: str | Path) -> list[Any]:
    """Records from a folder of ``*.json`` files, a JSON list, or a JSON-lines file, oldest first."""
    path = Path(path)
    if path.is_dir():
        records = [json.loads(p.read_text()) for p in sorted(path.glob("*.json"))]
    else:
        text = path.read_text()
        if text.lstrip().startswith("["):
            records = json.loads(text)
        else:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
    return sorted(records, key=lambda r: r.get("window", -1) if isinstance(r, dict) and
                  isinstance(r.get("window"), int) else -1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dso.protocol.provenance",
                                     description="Verify a provenance ledger (hash links, model continuity, "
                                                 "agreement with checkpoint hashes).")
    parser.add_argument("--records", required=True, help="folder of record *.json, a JSON list or JSON lines")
    parser.add_argument("--checkpoints", help='JSON object {"window": "model_hash"} of the checkpoints')
    parser.add_argument("--start-hash", default=GENESIS, help="prev_record_hash of the first record (default: genesis)")
    args = parser.parse_args(argv)
    try:
        records = load_records(args.records)
        checkpoints = None
        if args.checkpoints:
            raw = json.loads(Path(args.checkpoints).read_text())
            checkpoints = {int(k): str(v) for k, v in raw.items()}
    except (OSError, ValueError, AttributeError) as exc:
        print(f"cannot read input: {exc}", file=sys.stderr)
        return 2
    problems = verify_chain(records, checkpoints, args.start_hash)
    for p in problems:
        print(p)
    n_ck = len(checkpoints or {})
    print(f"{'OK' if not problems else 'FAILED'}: {len(records)} records, {n_ck} checkpoints, "
          f"{len(problems)} problems")
    return 0 if not problems else 1


if __name__ == "__main__":
    raise SystemExit(main())
