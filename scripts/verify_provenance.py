#!/usr/bin/env python
"""Verify a run's provenance ledger against its checkpoints (ZIP-400 §6, docs/extensions.md §6).

    python scripts/verify_provenance.py --config RUN/config.json [--validator UID] [--source both|chain|bucket]
                                        [--start-hash H] [--json]

Reads, for the leading validator (or ``--validator``), in the run its manifest names:
* its records: ``{run}/ledger/{t}`` in its bucket, and the chain's ledger when the chain keeps one (LocalChain);
* every checkpoint of the run in its bucket, each strictly decoded and checked against its own content hash.

Then checks every record's schema and self-hash, the hash links, strictly increasing windows, model
continuity (the new model of one round is the previous model of the next) and that each checkpoint holds
the model after the latest round before it.  With both sources it also requires the bucket's copies to be
the chain's records, and the chain ledger's own links and signatures to be intact.

Checkpoint ``checkpoint/{w}`` holds θ_w, the model *before* round w — i.e. the model after round w−1, which
is what :func:`dso.protocol.provenance.verify_chain` compares (its ``checkpoint_hashes[w-1]``).

Exit status: 0 verified, 1 problems (each printed), 2 the run could not be read.
"""
from __future__ import annotations

import argparse
import json
import sys

from dso.chain import ChainError
from dso.chain.factory import open_chain
from dso.config.schema import ConfigError
from dso.config.sources import from_dict, load_file
from dso.nn.model import build_model, parameter_shapes
from dso.protocol.provenance import GENESIS, verify_chain
from dso.protocol.rejections import Rejection
from storage import keys
from storage.checkpoint import load_checkpoint
from storage.client import StorageError
from storage.commitment import parse_commitment
from storage.gather import ReaderCache
from storage.jsonobj import get_json


class Unreadable(Exception):
    """The run's chain or the validator's bucket cannot be read at all (exit 2)."""


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="the run's config.json (as written by the local network)")
    p.add_argument("--validator", type=int, default=None, help="uid whose records to verify (default: the leader)")
    p.add_argument("--source", choices=("both", "chain", "bucket"), default="both",
                   help="where the records come from (default: both, cross-checked)")
    p.add_argument("--start-hash", default=GENESIS, help="prev_record_hash of the first record (a suffix of the "
                                                         "chain, e.g. after bucket retention)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return p.parse_args(argv)


def open_bucket(chain, uid: int, storage_cfg=None):
    """The validator's bucket, read under the run's endpoint policy (``storage.allow_loopback_endpoints``)."""
    info = parse_commitment(chain.commitment(uid))
    if info is None or isinstance(info, Rejection):
        raise Unreadable(f"validator uid {uid} has no usable bucket commitment on chain ({info})")
    readers = ReaderCache.from_config(storage_cfg) if storage_cfg is not None else ReaderCache()
    refused = readers.refusal(info)
    if refused is not None:
        raise Unreadable(f"validator uid {uid}: {refused}")
    return readers.get(info), info.bucket


def run_of_bucket(client, bucket: str, version: int) -> str:
    """The run id the validator's manifest names."""
    manifest = get_json(client, bucket, keys.manifest(version))
    run = None if isinstance(manifest, Rejection) else manifest.get("run")
    if not keys.is_run_id(run):
        raise Unreadable(f"the validator's bucket holds no run manifest naming a run ({manifest})")
    return run


def bucket_records(client, bucket: str, version: int, run: str) -> tuple[list, list[str]]:
    """Records stored as {run}/ledger/{t} (oldest first) and the problems met reading them."""
    records, problems = [], []
    found = sorted((p.window, o.key) for o in client.list(bucket, f"{run}/ledger/")
                   if (p := keys.parse(o.key)) is not None and p.kind == "ledger" and p.version == version
                   and p.run == run)
    for window, key in found:
        obj = get_json(client, bucket, key)
        if isinstance(obj, Rejection):
            problems.append(f"bucket {key}: unreadable ({obj})")
        elif obj.get("window") != window:
            problems.append(f"bucket {key}: holds the record of window {obj.get('window')!r}")
        else:
            records.append(obj)
    return records, problems


def chain_records(chain, hotkey: str) -> tuple[list, list[str]] | None:
    """The validator's records in the chain's ledger, and the ledger's own problems; None if it keeps none."""
    try:
        rows, problems = chain.ledger(), chain.verify_ledger()
    except ChainError as e:
        if e.reason == "unsupported":
            return None
        raise Unreadable(f"chain ledger: {e}") from None
    return [row["record"] for row in rows if row.get("hotkey") == hotkey], [f"chain ledger: {p}" for p in problems]


def checkpoint_hashes(client, bucket: str, hp, run: str) -> tuple[dict[int, str], list[str]]:
    """{round w: model hash after round w} from every checkpoint of the run in the bucket, each verified on load."""
    shapes = parameter_shapes(build_model(hp.model, hp.seed))
    out, problems = {}, []
    windows = sorted(p.window for o in client.list(bucket, f"{run}/checkpoint/")
                     if (p := keys.parse(o.key)) is not None and p.kind == "checkpoint"
                     and p.version == hp.protocol_version and p.run == run)
    for window in windows:
        ckpt = load_checkpoint(client, bucket, window, shapes, hp, run=run)
        if isinstance(ckpt, Rejection):
            problems.append(f"checkpoint of window {window}: {ckpt}")
        else:
            out[window - 1] = ckpt.model_hash  # θ_w = the model after round w − 1
            ckpt.close()
    return out, problems


def cross_check(from_chain: list, from_bucket: list) -> list[str]:
    """Every bucket copy must be the chain's record of that window (the bucket may hold fewer: retention)."""
    by_window = {r.get("window"): r for r in from_chain if isinstance(r, dict)}
    problems = []
    for record in from_bucket:
        theirs = by_window.get(record.get("window"))
        if theirs is None:
            problems.append(f"bucket record of window {record.get('window')} is not on chain")
        elif theirs != record:
            problems.append(f"bucket record of window {record.get('window')} differs from the chain's")
    return problems


def verify(args) -> dict:
    try:
        cfg = from_dict(load_file(args.config))
    except ConfigError as e:
        raise Unreadable(str(e)) from None
    hp = cfg.hparams
    try:
        chain = open_chain(cfg)
        uid = args.validator if args.validator is not None else getattr(chain.leading_validator(), "uid", None)
        if uid is None:
            raise Unreadable("no validator on chain")
        hotkey = next((n.hotkey for n in chain.metagraph() if n.uid == uid), None)
        if hotkey is None:
            raise Unreadable(f"uid {uid} is not registered")
        client, bucket = open_bucket(chain, uid, cfg.storage)
        run = run_of_bucket(client, bucket, hp.protocol_version)
        problems: list[str] = []
        on_chain = chain_records(chain, hotkey) if args.source in ("both", "chain") else None
        if args.source == "chain" and on_chain is None:
            raise Unreadable("this chain keeps no provenance ledger; use --source bucket")
        in_bucket = bucket_records(client, bucket, hp.protocol_version, run) if args.source != "chain" else None
        ckpts, ckpt_problems = checkpoint_hashes(client, bucket, hp, run)
    except ChainError as e:
        raise Unreadable(f"chain: {e}") from None
    except StorageError as e:
        raise Unreadable(f"bucket: {e}") from None
    if on_chain is not None:
        records, ledger_problems = on_chain
        problems += ledger_problems
        if in_bucket is not None:
            problems += in_bucket[1] + cross_check(records, in_bucket[0])
        source = "chain" if in_bucket is None else "chain (bucket copies cross-checked)"
    else:
        records, read_problems = in_bucket
        problems += read_problems
        source = "bucket"
    problems += ckpt_problems + verify_chain(records, ckpts, args.start_hash)
    return {"ok": not problems, "validator": uid, "run": run, "source": source, "records": len(records),
            "windows": [r.get("window") for r in records if isinstance(r, dict)],
            "checkpoints": sorted(w + 1 for w in ckpts), "problems": problems}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        result = verify(args)
    except Unreadable as e:
        print(f"verify_provenance: cannot read the run: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for problem in result["problems"]:
            print(problem)
        print(f"{'OK' if result['ok'] else 'FAILED'}: validator uid {result['validator']}, {result['records']} "
              f"records from {result['source']}, {len(result['checkpoints'])} checkpoints, "
              f"{len(result['problems'])} problems")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
