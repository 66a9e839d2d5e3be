"""Formats without a server: keys, commitments, wire payloads, checkpoints, bundles, peers lists, cleanup."""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from dso.nn.model import model_hash, state_hash
from dso.protocol.clock import PutWindow
from dso.protocol.payload import Payload, PayloadMeta
from dso.protocol.rejections import Reason, Rejection
from st_craft import build, honest, hostile, metadata_variants, split
from storage import keys
from storage.aggregate import decode_bundle, encode_bundle
from storage.checkpoint_file import decode_checkpoint, encode_checkpoint
from storage.cleanup import expired_keys
from storage.commitment import BucketInfo, bucket_name_problem, format_commitment, parse_commitment
from storage.gather import check_time
from storage.peers import PeersList, encode_peers, parse_peers
from storage.tensorfile import read_header
from storage.wire import Expect, decode_payload, encode_payload, payload_size_cap

# ------------------------------------------------------------------ keys
RUN, OTHER = "0123456789abcdef", "fedcba9876543210"


def test_run_scoped_keys_parse_back_and_refuse_a_bad_run():
    key = keys.ledger(9, 1, RUN)
    assert key == f"{RUN}/ledger/9-v1.json" and keys.parse(key) == keys.ParsedKey("ledger", 9, 1, run=RUN)
    assert keys.parse(keys.gradient(4, 2, 1, RUN)).run == RUN and keys.parse(keys.gradient(4, 2, 1)).run == ""
    assert keys.manifest(1) == "run/manifest-v1.json"  # unscoped: it is how a node learns the run
    for bad in ("ABCDEF0123456789", "0123", "../../../etc/pa", 5):
        with pytest.raises(ValueError):
            keys.gradient(1, 1, 1, bad)
    assert keys.parse(f"{RUN}/{RUN}/ledger/9-v1.json") is None


def test_cleanup_removes_every_object_of_another_run():
    ours = [keys.gradient(w, 1, 1, RUN) for w in range(8, 10)] + [keys.checkpoint(0, 1, RUN)]
    theirs = [keys.gradient(9, 1, 1, OTHER), keys.checkpoint(9, 1, OTHER), keys.ledger(9, 1)]
    doomed = expired_keys(ours + theirs + ["notes.txt"], current_window=10, retention_windows=5, run=RUN)
    assert doomed == sorted(theirs)  # the newest checkpoint of our run stays, whatever its window


def test_keys_follow_the_design_layout_and_parse_back():
    assert keys.gradient(12, 3, 1) == "gradient/12/3-v1.safetensors"
    assert keys.checkpoint(40, 2) == "checkpoint/40-v2.json"
    assert keys.checkpoint_shard(40, 3, 2) == "checkpoint/40/3-v2.safetensors"
    shard = keys.parse(keys.checkpoint_shard(40, 3, 2))
    assert (shard.kind, shard.window, shard.uid, shard.version) == ("checkpoint_shard", 40, 3, 2)
    assert keys.latest_checkpoint(1) == "checkpoint/latest-v1.json"
    assert keys.peers(7, 1) == "peers/7-v1.json"
    assert keys.aggregate(7, 1) == "aggregate/7-v1.safetensors"
    assert keys.ledger(7, 1) == "ledger/7-v1.json"
    assert keys.commit(7, 5, 1) == "commit/7/5-v1.json"
    parsed = keys.parse(keys.gradient(12, 3, 1))
    assert (parsed.kind, parsed.window, parsed.uid, parsed.version) == ("gradient", 12, 3, 1)
    assert keys.parse(keys.ledger(9, 4)).window == 9
    for other in ("checkpoint/latest-v1.json", "gradient/01/3-v1.safetensors", "notes.txt", "peers/7-v1.json.bak"):
        assert keys.parse(other) is None
    with pytest.raises(ValueError):
        keys.gradient(-1, 0, 1)
    with pytest.raises(ValueError):
        keys.gradient(True, 0, 1)


# ----------------------------------------------------------- commitments
INFO = BucketInfo("http://127.0.0.1:9090", "us-east-1", "dso-alice", "AKIAEXAMPLE123", "abc/DEF+ghi=")


def test_commitment_round_trip_and_secret_not_in_repr():
    text = format_commitment(INFO)
    assert text == "dso1|http://127.0.0.1:9090|us-east-1|dso-alice|AKIAEXAMPLE123|abc/DEF+ghi="
    assert parse_commitment(text) == INFO
    assert "ghi" not in repr(INFO)
    r2 = BucketInfo("https://acc.r2.cloudflarestorage.com", "auto", "my.bucket-1", "a" * 32, "f" * 64)
    assert parse_commitment(format_commitment(r2)) == r2


@pytest.mark.parametrize("text", [
    None, 42, "", "dso1", "dso2|http://h|us-east-1|dso-a|K|S",
    "dso1|http://h|us-east-1|dso-a|K",                       # 5 fields
    "dso1|http://h|us-east-1|dso-a|K|S|extra",
    "dso1|ftp://h|us-east-1|dso-a|K|S",                      # scheme
    "dso1|http://|us-east-1|dso-a|K|S",                      # no host
    "dso1|http://u:p@h|us-east-1|dso-a|K|S",                 # user info
    "dso1|http://h/path|us-east-1|dso-a|K|S",                # path
    "dso1|http://h:99999|us-east-1|dso-a|K|S",               # port
    "dso1|http://h|US_EAST|dso-a|K|S",                       # region
    "dso1|http://h|us-east-1|Bad_Bucket|K|S",                # bucket chars
    "dso1|http://h|us-east-1|ab|K|S",                        # bucket too short
    "dso1|http://h|us-east-1|192.168.1.1|K|S",               # bucket like an IP
    "dso1|http://h|us-east-1|dso..a|K|S",
    "dso1|http://h|us-east-1|dso-a||S",                      # empty key id
    "dso1|http://h|us-east-1|dso-a|K|",                      # empty secret
    "dso1|http://h|us-east-1|dso-a|K|sec ret",
    "dso1|http://h|us-east-1|dso-a|K|s\u00e9cret",
    "dso1|http://h|us-east-1|dso-a|K|" + "s" * 600,          # length bound
])
def test_malformed_commitments_are_rejections(text):
    result = parse_commitment(text)
    assert isinstance(result, Rejection) and result.reason is Reason.BAD_COMMITMENT


def test_bucket_name_rules():
    assert bucket_name_problem("dso-alice") is None
    assert bucket_name_problem("a" * 63) is None
    for bad in ("a" * 64, "-abc", "abc-", "xn--abc", "abc-s3alias", "a.-b", "ABC"):
        assert bucket_name_problem(bad) is not None
    with pytest.raises(ValueError):
        format_commitment(BucketInfo("http://h", "us-east-1", "Bad", "K", "S"))


# ------------------------------------------------------------ wire format
def test_payload_round_trip_is_bit_exact(codec, make_update, hp):
    update = make_update(1)
    sync = torch.randn(hp.sync_samples)
    data = honest(codec, update, hp, uid=3, window=9, sync=sync)
    assert len(data) <= payload_size_cap(codec, hp.sync_samples)
    got = decode_payload(data, codec, Expect.from_hparams(hp, 9, uid=3))
    assert isinstance(got, Payload), got
    assert (got.meta.uid, got.meta.window, got.meta.hparams_digest) == (3, 9, hp.digest())
    assert torch.equal(got.sync_values, sync)
    for name, u in update.items():
        assert torch.equal(got.update[name].idx, u.idx)
        assert torch.equal(got.update[name].codes, u.codes)
        assert torch.equal(got.update[name].scale, u.scale)
    # decoded update decompresses to the same dense tensors
    dense_a, dense_b = codec.decompress(update), codec.decompress(got.update)
    assert all(torch.equal(dense_a[n], dense_b[n]) for n in dense_a)


def test_size_cap_equals_tensor_bytes_plus_header_allowance(codec, hp):
    data_bytes = sum(math.prod(s) * np.dtype(d).itemsize for d, s in codec.wire_spec().values())
    n_tensors = len(codec.wire_spec()) + 1
    assert payload_size_cap(codec, hp.sync_samples) == 8 + 4096 + 256 * n_tensors + data_bytes + 4 * hp.sync_samples


@pytest.mark.parametrize("reason", [r.value for r in (
    Reason.MALFORMED, Reason.TOO_LARGE, Reason.BAD_KEYS, Reason.BAD_DTYPE, Reason.BAD_SHAPE,
    Reason.INDEX_OUT_OF_RANGE, Reason.WRONG_COUNT, Reason.BAD_ENCODING, Reason.NON_FINITE,
    Reason.METADATA_MISMATCH)])
def test_each_crafted_payload_is_rejected_with_its_reason(reason, codec, make_update, hp):
    data = hostile(codec, make_update(2), hp, uid=5, window=11)[reason]
    got = decode_payload(data, codec, Expect.from_hparams(hp, 11, uid=5))
    assert isinstance(got, Rejection), f"{reason} accepted"
    assert got.reason.value == reason, got


def test_every_metadata_disagreement_is_a_mismatch(codec, make_update, hp):
    for what, data in metadata_variants(codec, make_update(3), hp, uid=5, window=11).items():
        got = decode_payload(data, codec, Expect.from_hparams(hp, 11, uid=5))
        assert isinstance(got, Rejection) and got.reason is Reason.METADATA_MISMATCH, (what, got)


def _with_meta(codec, update, hp, uid: int, window: int, /, **changes) -> bytes:
    entries, md = split(honest(codec, update, hp, uid, window))
    return build(entries, {**md, **changes})


def test_data_hash_of_the_run_is_compared(codec, make_update, hp):
    """docs/protocol.md says a payload with another data hash is rejected; the hash was never
    compared because no caller set it.  Expect.from_hparams now takes the run's data hash (by default the
    pinned hp.data_hash)."""
    ours, theirs = "ab" * 32, "cd" * 32
    pinned = dataclasses.replace(hp, data_hash=ours)
    update = make_update(6)
    good = _with_meta(codec, update, pinned, 1, 2, data_hash=ours)
    other = _with_meta(codec, update, pinned, 1, 2, data_hash=theirs)
    assert isinstance(decode_payload(good, codec, Expect.from_hparams(pinned, 2)), Payload)
    got = decode_payload(other, codec, Expect.from_hparams(pinned, 2))
    assert isinstance(got, Rejection) and got.reason is Reason.METADATA_MISMATCH and "data_hash" in got.detail
    # an unpinned run passes the hash its own dataset computed
    other = _with_meta(codec, update, hp, 1, 2, data_hash=theirs)
    got = decode_payload(other, codec, Expect.from_hparams(hp, 2, data_hash=ours))
    assert isinstance(got, Rejection) and got.reason is Reason.METADATA_MISMATCH and "data_hash" in got.detail
    assert Expect.from_hparams(hp, 2).data_hash is None  # nothing pinned, nothing given: not checked


def test_every_documented_metadata_field_is_compared(codec, make_update, hp):
    """docs/storage.md lists the metadata keys; each one, changed alone, is a mismatch naming that key."""
    update = make_update(7)
    pinned = dataclasses.replace(hp, data_hash="ab" * 32)
    expect = Expect.from_hparams(pinned, 2, uid=1, model_hash="ef" * 32)
    base = {"data_hash": "ab" * 32, "model_hash": "ef" * 32}
    assert isinstance(decode_payload(_with_meta(codec, update, pinned, 1, 2, **base), codec, expect), Payload)
    changes = {"format": "dso-other", "protocol_version": str(hp.protocol_version + 1), "uid": "2", "window": "3",
               "hparams": "0" * 16, "data_hash": "cd" * 32, "model_hash": "01" * 32,
               "trained": str(hp.assigned_sequences + 1)}   # more than its assignment holds
    for name, value in codec.settings().items():
        changes[f"codec.{name}"] = str(value) + "0"
    _, md = split(honest(codec, update, pinned, 1, 2))
    assert set(changes) == set(md)  # every key the encoder writes is exercised
    for key, value in changes.items():
        got = decode_payload(_with_meta(codec, update, pinned, 1, 2, **{**base, key: value}), codec, expect)
        assert isinstance(got, Rejection) and got.reason is Reason.METADATA_MISMATCH, (key, got)
        assert key in got.detail, (key, got.detail)


def test_optional_expectations_data_and_model_hash(codec, make_update, hp):
    data = honest(codec, make_update(4), hp, uid=1, window=2)
    assert isinstance(decode_payload(data, codec, Expect.from_hparams(hp, 2)), Payload)  # uid unchecked
    got = decode_payload(data, codec, Expect.from_hparams(hp, 2, model_hash="ab" * 32))
    assert isinstance(got, Rejection) and got.reason is Reason.METADATA_MISMATCH


@pytest.mark.parametrize("mutate", [
    lambda d: d[:7],                                          # shorter than the length prefix
    lambda d: (10 ** 9).to_bytes(8, "little") + d[8:],        # header length absurd
    lambda d: len(d).to_bytes(8, "little") + d[8:],           # header runs past the end
    lambda d: d[:-1],                                         # truncated data
    lambda d: d + b"\0",                                      # trailing bytes
    lambda d: d[:8] + b"[" + d[9:],                           # header not an object / invalid JSON
    lambda d: d[:8] + d[8:].replace(b'"data_offsets":[0,', b'"data_offsets":[1,', 1),  # gap
    lambda d: d[:8] + d[8:].replace(b'"dtype":"U8"', b'"dtype":"Q8"', 1),            # unknown dtype
])
def test_container_corruption_is_malformed_never_an_exception(mutate, codec, make_update, hp):
    data = mutate(honest(codec, make_update(5), hp, uid=1, window=2))
    got = decode_payload(data, codec, Expect.from_hparams(hp, 2, uid=1))
    assert isinstance(got, Rejection) and got.reason is Reason.MALFORMED, got


def test_duplicate_header_keys_and_nan_literals_are_malformed():
    dup = b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
    data = len(dup).to_bytes(8, "little") + dup + b"\0"
    assert read_header(data, 4096).reason is Reason.MALFORMED
    nan = b'{"__metadata__":{"x":"y"},"a":{"dtype":"F32","shape":[NaN],"data_offsets":[0,4]}}'
    assert read_header(len(nan).to_bytes(8, "little") + nan + b"\0" * 4, 4096).reason is Reason.MALFORMED


def test_random_garbage_never_raises(codec, hp):
    rng = np.random.default_rng(0)
    expect = Expect.from_hparams(hp, 0)
    for size in (0, 1, 8, 9, 100, 5000):
        for _ in range(5):
            assert isinstance(decode_payload(rng.bytes(size), codec, expect), Rejection)


def test_put_window_edges_with_one_second_tolerance():
    pw = PutWindow(window=4, open=1000.0, close=1003.0)
    assert check_time(pw, 999.0) is None                        # open - 1 s: still inside
    assert check_time(pw, 998.999).reason is Reason.TOO_EARLY
    assert check_time(pw, 1003.0) is None                       # close: inside
    assert check_time(pw, 1003.001).reason is Reason.TOO_LATE
    assert check_time(None, 0.0) is None


# -------------------------------------------------------------- checkpoints
def test_checkpoint_round_trip_and_hash(model, shapes, hp):
    data, h = encode_checkpoint(model.named_parameters(), 7, hp.protocol_version, hp.digest(), "d" * 8)
    assert h == model_hash(model)
    ckpt = decode_checkpoint(data, shapes, hp.protocol_version, hp.digest(), expect_window=7, expect_hash=h)
    assert not isinstance(ckpt, Rejection), ckpt
    assert (ckpt.window, ckpt.model_hash, ckpt.data_hash) == (7, h, "d" * 8)
    assert list(ckpt.tensors) == list(shapes)
    assert state_hash(ckpt.tensors.items()) == h


def test_checkpoint_with_one_tampered_byte_fails_its_hash(model, shapes, hp):
    data, h = encode_checkpoint(model.named_parameters(), 7, hp.protocol_version, hp.digest())
    entries, md = split(data)
    name = next(iter(entries))
    dtype, shape, raw = entries[name]
    tampered = dict(entries)
    tampered[name] = (dtype, shape, bytes([raw[0] ^ 1]) + raw[1:])  # lowest mantissa bit: still finite
    got = decode_checkpoint(build(tampered, md), shapes, hp.protocol_version)
    assert isinstance(got, Rejection) and got.reason is Reason.METADATA_MISMATCH and "hash" in got.detail


def test_checkpoint_shape_and_finiteness_checks(model, shapes, hp):
    wrong = dict(shapes)
    first = next(iter(wrong))
    wrong[first] = (shapes[first][0] + 1, *shapes[first][1:])
    data, _ = encode_checkpoint(model.named_parameters(), 1, hp.protocol_version, hp.digest())
    assert decode_checkpoint(data, wrong, hp.protocol_version).reason is Reason.BAD_SHAPE
    nan = {n: p.detach().clone() for n, p in model.named_parameters()}
    nan[first][0] = float("nan")
    data, _ = encode_checkpoint(nan.items(), 1, hp.protocol_version, hp.digest())
    assert decode_checkpoint(data, shapes, hp.protocol_version).reason is Reason.NON_FINITE
    assert decode_checkpoint(data, shapes, hp.protocol_version + 1).reason is Reason.METADATA_MISMATCH


# ------------------------------------------------------------------ bundles
def _payloads(codec, make_update, hp, window, uids):
    out = {}
    for uid in uids:
        meta = PayloadMeta(uid, window, hp.protocol_version, hp.digest())
        data = encode_payload(codec, make_update(uid), torch.full((hp.sync_samples,), 0.5), meta)
        out[uid] = decode_payload(data, codec, Expect.from_hparams(hp, window, uid=uid))
    return out


def test_bundle_round_trip_keeps_the_aggregation_order(codec, make_update, hp):
    payloads = _payloads(codec, make_update, hp, 3, (7, 2, 5))
    data = encode_bundle(codec, 3, [7, 2, 5], payloads, "a" * 64, "b" * 64, hp.protocol_version, hp.digest(),
                         "c" * 64, "d" * 64)
    bundle = decode_bundle(data, codec, Expect.from_hparams(hp, 3), max_peers=4)
    assert not isinstance(bundle, Rejection), bundle
    assert bundle.uids == [7, 2, 5] and list(bundle.payloads) == [7, 2, 5] and bundle.nbytes == len(data)
    assert (bundle.model_hash_before, bundle.model_hash_after) == ("a" * 64, "b" * 64)
    for uid in (7, 2, 5):
        assert bundle.payloads[uid].meta.uid == uid
        assert codec.to_wire(bundle.payloads[uid].update).keys() == codec.to_wire(payloads[uid].update).keys()
        for key, value in codec.to_wire(bundle.payloads[uid].update).items():
            assert np.array_equal(value, codec.to_wire(payloads[uid].update)[key]), key
    empty = encode_bundle(codec, 3, [], {}, "a" * 64, "a" * 64, hp.protocol_version, hp.digest(),
                         "c" * 64, "d" * 64)
    assert decode_bundle(empty, codec, Expect.from_hparams(hp, 3), max_peers=4).uids == []


def test_bundle_strictness(codec, make_update, hp):
    payloads = _payloads(codec, make_update, hp, 3, (1, 2))
    good = encode_bundle(codec, 3, [1, 2], payloads, "a" * 64, "b" * 64, hp.protocol_version, hp.digest(),
                         "c" * 64, "d" * 64)
    expect = Expect.from_hparams(hp, 3)
    entries, md = split(good)
    dtype, shape, raw = entries["payload.2"]
    flipped = dict(entries, **{"payload.2": (dtype, shape, raw[:-1] + bytes([raw[-1] ^ 1]))})
    cases = {
        "content hash": (build(flipped, md), Reason.METADATA_MISMATCH),
        "window": (good, Reason.METADATA_MISMATCH),  # read as window 4 below
        "duplicate uid": (build(entries, dict(md, uids="1,1")), Reason.METADATA_MISMATCH),
        "more uids than G": (build(entries, dict(md, uids="1,2,3", sha256=",".join([md["sha256"][:64]] * 3))),
                             Reason.METADATA_MISMATCH),
        "extra tensor": (build(dict(entries, extra=entries["payload.1"]), md), Reason.BAD_KEYS),
        "hash field": (build(entries, dict(md, model_hash_after="zz")), Reason.METADATA_MISMATCH),
    }
    for name, (data, reason) in cases.items():
        got = decode_bundle(data, codec, Expect.from_hparams(hp, 4) if name == "window" else expect, max_peers=2)
        assert isinstance(got, Rejection) and got.reason is reason, (name, got)
    # a payload inside that breaks the wire rules is the payload's own rejection
    bad_meta = PayloadMeta(2, 3, hp.protocol_version, "f" * 16)
    payloads[2] = decode_payload(encode_payload(codec, make_update(2), torch.zeros(hp.sync_samples), bad_meta), codec,
                                 Expect(3, hp.protocol_version, "f" * 16, hp.sync_samples))
    forged = encode_bundle(codec, 3, [1, 2], payloads, "a" * 64, "b" * 64, hp.protocol_version, hp.digest(),
                         "c" * 64, "d" * 64)
    assert decode_bundle(forged, codec, expect, max_peers=2).reason is Reason.METADATA_MISMATCH


def test_bundle_carries_each_payloads_signed_bytes_and_signature(codec, make_update, hp):
    """Payloads read from the wire go into the bundle as the very bytes their miners signed, with the signature
    (one per uid in ``signatures``, the same order); a payload never read from the wire goes in canonically
    encoded and unsigned.  A signatures field that is not one hex signature (or none) per uid is refused."""
    from dso.protocol import signatures
    from signing import wallet_of
    payloads = _payloads(codec, make_update, hp, 3, (1, 2))
    blob = encode_payload(codec, payloads[1].update, payloads[1].sync_values, payloads[1].meta)
    sig = signatures.sign_payload(wallet_of(1), "", 3, 1, blob)
    payloads[1].raw, payloads[1].sha256, payloads[1].signature = blob, signatures.digest(blob), sig
    data = encode_bundle(codec, 3, [1, 2], payloads, "a" * 64, "b" * 64, hp.protocol_version, hp.digest(),
                         "c" * 64, "d" * 64)
    bundle = decode_bundle(data, codec, Expect.from_hparams(hp, 3), max_peers=2)
    assert not isinstance(bundle, Rejection), bundle
    assert bundle.payloads[1].raw == blob and bundle.payloads[1].signature == sig
    assert bundle.payloads[1].sha256 == signatures.digest(blob) and bundle.payloads[2].signature == ""
    entries, md = split(data)
    assert md["signatures"] == f"{sig},"
    for bad in (f"{sig}", f"{sig},{sig},", f"{sig[:-1]}x,", "zz,"):
        got = decode_bundle(build(entries, dict(md, signatures=bad)), codec, Expect.from_hparams(hp, 3), max_peers=2)
        assert isinstance(got, Rejection) and got.reason is Reason.METADATA_MISMATCH, bad


# --------------------------------------------------------------- peers list
def test_peers_list_round_trip_and_strictness():
    pl = PeersList(window=5, version=1, uids=(4, 2, 9), extra={"validator": 0})
    back = parse_peers(encode_peers(pl), expect_window=5, version=1)
    assert back == pl
    bad = [b"[]", b"{", b'{"window": 5, "version": 1}', b'{"window": 5, "version": 1, "uids": [1, 1]}',
           b'{"window": 5, "version": 1, "uids": [-1]}', b'{"window": 5, "version": 1, "uids": [true]}',
           b'{"window": "5", "version": 1, "uids": []}', b'{"window": 5, "version": 1, "uids": [NaN]}',
           json.dumps({"window": 5, "version": 1, "uids": list(range(5000))}).encode(),
           b"[" * 100000]
    for data in bad:
        got = parse_peers(data)
        assert isinstance(got, Rejection) and got.reason in (Reason.MALFORMED, Reason.TOO_LARGE), data[:40]
    assert parse_peers(encode_peers(pl), expect_window=6).reason is Reason.METADATA_MISMATCH


# ------------------------------------------------------------------ cleanup
def test_expired_keys_keep_recent_windows_and_newest_checkpoint():
    all_keys = [keys.gradient(w, 1, 1) for w in range(10)] + [keys.checkpoint(w, 1) for w in (0, 5)] + [
        keys.latest_checkpoint(1), keys.aggregate(2, 1), keys.peers(6, 1), "unrelated/file.bin"]
    doomed = expired_keys(all_keys, current_window=10, retention_windows=3)
    assert doomed == sorted([keys.gradient(w, 1, 1) for w in range(7)] + [keys.checkpoint(0, 1),
                                                                           keys.aggregate(2, 1), keys.peers(6, 1)])
    assert expired_keys(all_keys, 10, 100) == []
