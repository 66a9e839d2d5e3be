"""Provenance ledger: records, hash links, chain verification, the verify command."""
from __future__ import annotations

import copy
import hashlib
import json

import pytest
import torch

from dso.config.schema import ModelConfig
from dso.nn.model import build_model, model_hash
from dso.protocol.provenance import GENESIS, main, make_record, record_hash, verify_chain

torch.set_num_threads(1)


def people(*uids):
    return [{"uid": u, "score": 0.1 * u, "weight": 1.0 / len(uids), "contribution": 0.5} for u in uids]


def build_chain(n=4, start_window=10):
    models = [f"{i:064x}" for i in range(n + 1)]
    records, prev = [], GENESIS
    for i in range(n):
        r = make_record(start_window + 2 * i, models[i], models[i + 1], people(3, 1, 2), prev, "5Validator",
                        extra={"rule": "mean"})
        records.append(r)
        prev = r["record_hash"]
    return records, models


def test_record_hash_is_sha256_of_canonical_json():
    r = make_record(3, "aa", "bb", people(2, 1), GENESIS, "hk")
    body = {k: v for k, v in r.items() if k != "record_hash"}
    blob = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    assert r["record_hash"] == hashlib.sha256(blob).hexdigest() == record_hash(r)
    assert [c["uid"] for c in r["contributors"]] == [1, 2]  # sorted, so the hash does not depend on order
    assert make_record(3, "aa", "bb", people(1, 2), GENESIS, "hk")["record_hash"] == r["record_hash"]


@pytest.mark.parametrize("bad", [
    dict(window=-1), dict(window=True), dict(contributors=[{"uid": 1, "score": float("nan"), "weight": 1,
                                                            "contribution": 0}]),
    dict(contributors=people(1, 1)), dict(contributors=[{"uid": 1}]), dict(validator=None),
    dict(extra={"x": float("inf")}),
])
def test_make_record_refuses_malformed_input(bad):
    args = dict(window=1, prev_model_hash="a", new_model_hash="b", contributors=people(1),
                prev_record_hash=GENESIS, validator="hk")
    args.update(bad)
    with pytest.raises(ValueError):
        make_record(**args)


def test_valid_chain_verifies_with_checkpoints():
    records, models = build_chain()
    assert verify_chain(records) == []
    # checkpoints: after rounds (windows 10, 12, 14, 16), between rounds, and before the first round
    checkpoints = {10: models[1], 13: models[2], 16: models[4], 20: models[4], 5: models[0]}
    assert verify_chain(records, checkpoints) == []


def test_tampering_is_detected():
    records, models = build_chain()
    edited = copy.deepcopy(records)
    edited[1]["contributors"][0]["weight"] = 0.9  # content changed, hash kept
    assert any("record_hash does not match" in p for p in verify_chain(edited))
    rehashed = copy.deepcopy(edited)
    rehashed[1]["record_hash"] = record_hash(rehashed[1])  # re-hashed: the next link breaks instead
    assert any("does not link" in p for p in verify_chain(rehashed))
    dropped = records[:1] + records[2:]  # a missing round breaks links and model continuity
    problems = verify_chain(dropped)
    assert any("does not link" in p for p in problems) and any("starts from model" in p for p in problems)
    swapped = [records[1], records[0], *records[2:]]
    assert any("does not follow" in p for p in verify_chain(swapped))
    assert any("first record links" in p for p in verify_chain(records[1:]))
    assert verify_chain(records[1:], start_hash=records[0]["record_hash"]) == []


def test_model_discontinuity_and_checkpoint_disagreement():
    records, models = build_chain()
    forged = make_record(18, "f" * 64, "e" * 64, people(1), records[-1]["record_hash"], "5Validator")
    assert any("starts from model" in p for p in verify_chain(records + [forged]))
    problems = verify_chain(records, {12: models[3]})
    assert len(problems) == 1 and "checkpoint of window 12" in problems[0]


@pytest.mark.parametrize("junk", [None, 7, "x", [], {"window": 1}])
def test_garbage_records_are_reported_not_raised(junk):
    records, _ = build_chain(2)
    problems = verify_chain([records[0], junk, records[1]])
    assert problems and any(p.startswith("#1") for p in problems)


def test_chain_against_real_model_hashes_and_cli(tmp_path, capsys):
    cfg = ModelConfig(d_model=16, n_layers=1, n_heads=2, ffn_hidden=32, seq_len=8)
    model = build_model(cfg, seed=1)
    hashes = [model_hash(model)]
    records, prev = [], GENESIS
    for window in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(1e-3 * torch.sign(torch.randn_like(p)))
        hashes.append(model_hash(model))
        r = make_record(window, hashes[-2], hashes[-1], people(window + 1), prev, "5V")
        records.append(r)
        prev = r["record_hash"]
    folder = tmp_path / "ledger"
    folder.mkdir()
    for r in records:
        (folder / f"{r['window']}-v1.json").write_text(json.dumps(r))
    ck = tmp_path / "ck.json"
    ck.write_text(json.dumps({"2": hashes[3], "1": hashes[2]}))
    assert main(["--records", str(folder), "--checkpoints", str(ck)]) == 0
    assert "OK: 3 records, 2 checkpoints" in capsys.readouterr().out
    ck.write_text(json.dumps({"1": hashes[3]}))
    assert main(["--records", str(folder), "--checkpoints", str(ck)]) == 1
    jsonl = tmp_path / "ledger.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in reversed(records)))  # order restored by window
    assert main(["--records", str(jsonl)]) == 0
    assert main(["--records", str(tmp_path / "missing")]) == 2
