"""The storage contract against each S3 engine (real HTTP on loopback, auth on): moto and SeaweedFS."""
from __future__ import annotations

import json
import time

import pytest
import requests
import torch

from dso.nn.model import build_model, model_hash
from dso.protocol.clock import PutWindow
from dso.protocol.payload import Payload
from dso.protocol.rejections import Reason, Rejection
from st_craft import honest, hostile
from storage import keys
from storage.aggregate import encode_bundle, get_bundle, put_bundle
from storage.checkpoint import load_latest_checkpoint, read_latest, save_checkpoint
from storage.cleanup import cleanup
from storage.client import S3Client, StorageError
from storage.gather import fetch_payload
from storage.peers import PeersList, get_peers, put_peers
from storage.server import AdminCredentials
from storage.server import main as server_main
from storage.wire import Expect

FAR = time.monotonic() + 3600  # a deadline that never bites


@pytest.fixture(scope="module")
def alice(s3):
    return s3.provision("alice")


@pytest.fixture(scope="module")
def bob(s3):
    return s3.provision("bob")


# -------------------------------------------------------------- auth
def test_read_only_key_cannot_put(alice):
    with pytest.raises(StorageError) as e:
        alice.read_client().put(alice.bucket, "x", b"nope")
    assert e.value.kind == "denied" and e.value.status == 403


def test_write_key_cannot_touch_another_peers_bucket(alice, bob):
    bob.write_client().put(bob.bucket, "mine", b"bob's")
    w = alice.write_client()
    for attempt in (lambda: w.put(bob.bucket, "x", b"evil"), lambda: w.delete(bob.bucket, ["mine"]),
                    lambda: w.get(bob.bucket, "mine"), lambda: w.ensure_bucket("dso-mallory")):
        with pytest.raises(StorageError) as e:
            attempt()
        assert e.value.kind == "denied" and e.value.status == 403
    assert bob.read_client().get(bob.bucket, "mine") == b"bob's"


def test_read_key_reads_only_its_own_bucket(alice, bob):
    alice.write_client().put(alice.bucket, "hello", b"hi")
    assert alice.read_client().get(alice.bucket, "hello") == b"hi"
    assert [o.key for o in alice.read_client().list(alice.bucket)] == ["hello"]
    with pytest.raises(StorageError) as e:
        bob.read_client().get(alice.bucket, "hello")
    assert e.value.kind == "denied"


def test_unknown_keys_and_anonymous_requests_are_refused(s3, alice):
    bogus = S3Client(s3.endpoint, "us-east-1", "AKIANOBODY000000", "x" * 40, max_attempts=1)
    with pytest.raises(StorageError) as e:
        bogus.get(alice.bucket, "hello")
    assert e.value.kind == "denied"
    wrong_secret = S3Client(s3.endpoint, "us-east-1", alice.read_key_id, "y" * 40, max_attempts=1)
    with pytest.raises(StorageError):
        wrong_secret.get(alice.bucket, "hello")
    assert requests.get(f"{s3.endpoint}/{alice.bucket}/hello", timeout=10).status_code == 403


def test_moto_control_api_is_unreachable(s3, alice):
    if s3.name != "moto":
        pytest.skip(f"only moto has a control API (/moto-api) that could switch auth off; not {s3.name}")
    bogus = S3Client(s3.endpoint, "us-east-1", "AKIANOBODY000000", "x" * 40, max_attempts=1)
    assert requests.post(f"{s3.endpoint}/moto-api/reset-auth", data=b"inf", timeout=10).status_code == 403
    with pytest.raises(StorageError) as e:
        bogus.get(alice.bucket, "hello")
    assert e.value.kind == "denied"


def test_reprovisioning_revokes_old_keys(s3):
    first = s3.provision("carol")
    first.write_client().put(first.bucket, "k", b"v")
    second = s3.provision("carol")
    assert second.read_client().get(second.bucket, "k") == b"v"  # bucket reused
    with pytest.raises(StorageError):
        first.read_client().get(first.bucket, "k")


def test_cli_provision_prints_credentials_and_commitment(s3, tmp_path, capsys):
    if s3.name != "moto":
        pytest.skip(f"the IAM provisioning path needs an IAM API (moto, AWS); {s3.name} is covered by "
                    "test_storage_provision.py")
    admin_file = tmp_path / "admin.json"
    s3.admin.save(admin_file)
    assert oct(admin_file.stat().st_mode & 0o777) == "0o600"
    assert AdminCredentials.load(admin_file) == s3.admin
    assert server_main(["provision", "dave", "--admin-file", str(admin_file)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bucket"] == "dso-dave" and out["commitment"].startswith(f"dso1|{s3.endpoint}|")
    w = S3Client(out["endpoint"], out["region"], out["write_key_id"], out["write_secret"])
    w.put("dso-dave", "x", b"1")


# ------------------------------------------------------------ client
def test_round_trip_counters_missing_and_cap(alice):
    w, r = alice.write_client(), alice.read_client()
    w.put(alice.bucket, "blob", b"x" * 1000)
    assert w.bytes_up == 1000
    info = r.head(alice.bucket, "blob")
    assert info.size == 1000 and abs(info.last_modified - time.time()) < 120
    assert r.get(alice.bucket, "blob") == b"x" * 1000 and r.bytes_down == 1000
    with pytest.raises(StorageError) as e:
        r.get(alice.bucket, "blob", max_bytes=999)
    assert e.value.kind == "too_large"
    with pytest.raises(StorageError) as e:
        r.head(alice.bucket, "absent")
    assert e.value.kind == "missing"
    assert w.ensure_bucket(alice.bucket) is False  # reused, not recreated


def test_large_objects_go_multipart(alice):
    w = alice.write_client(multipart_threshold=5 * 2 ** 20, multipart_chunksize=5 * 2 ** 20)
    data = bytes(range(256)) * (11 * 2 ** 20 // 256)
    w.put(alice.bucket, "big", data)
    info = alice.read_client().head(alice.bucket, "big")
    assert info.etag.endswith("-3")  # S3 multipart ETag: md5-of-parts "-" part count
    assert alice.read_client().get(alice.bucket, "big") == data


# -------------------------------------------------------- payload objects
def test_payload_round_trip_through_s3(alice, codec, make_update, hp):
    update = make_update(10)
    alice.write_client().put(alice.bucket, keys.gradient(3, 7, hp.protocol_version), honest(codec, update, hp, 7, 3))
    got, nbytes = fetch_payload(alice.read_client(), alice.bucket, keys.gradient(3, 7, hp.protocol_version), codec,
                                Expect.from_hparams(hp, 3, uid=7), None, FAR)
    assert isinstance(got, Payload), got
    assert nbytes == got.nbytes and got.last_modified is not None
    assert all(torch.equal(got.update[n].idx, u.idx) and torch.equal(got.update[n].codes, u.codes)
               for n, u in update.items())


def test_every_crafted_object_is_reported_with_its_reason(bob, codec, make_update, hp):
    w, r = bob.write_client(), bob.read_client()
    for i, (reason, data) in enumerate(hostile(codec, make_update(11), hp, uid=20, window=4).items()):
        key = f"crafted/{i}.safetensors"
        w.put(bob.bucket, key, data)
        got, _ = fetch_payload(r, bob.bucket, key, codec, Expect.from_hparams(hp, 4, uid=20), None, FAR)
        assert isinstance(got, Rejection) and got.reason.value == reason, (reason, got)
    got, _ = fetch_payload(r, bob.bucket, "crafted/absent", codec, Expect.from_hparams(hp, 4), None, FAR)
    assert got.reason is Reason.MISSING


def test_too_large_is_decided_by_head_before_download(bob, codec, make_update, hp):
    data = hostile(codec, make_update(12), hp, uid=1, window=4)["too_large"]
    bob.write_client().put(bob.bucket, "huge", data)
    r = bob.read_client()
    got, nbytes = fetch_payload(r, bob.bucket, "huge", codec, Expect.from_hparams(hp, 4), None, FAR)
    assert got.reason is Reason.TOO_LARGE and nbytes == 0 and r.bytes_down == 0


def test_too_early_and_too_late_around_both_edges(alice, codec, make_update, hp):
    key = keys.gradient(5, 1, hp.protocol_version)
    alice.write_client().put(alice.bucket, key, honest(codec, make_update(13), hp, 1, 5))
    r = alice.read_client()
    lm = r.head(alice.bucket, key).last_modified  # server clock, whole seconds
    assert lm == int(lm)
    cases = [(PutWindow(5, lm + 1.0, lm + 9), None),               # exactly open - 1 s: accepted
             (PutWindow(5, lm + 1.001, lm + 9), Reason.TOO_EARLY),
             (PutWindow(5, lm + 0.5, lm + 9), None),
             (PutWindow(5, lm - 9, lm), None),                      # exactly at close: accepted
             (PutWindow(5, lm - 9, lm - 0.001), Reason.TOO_LATE),
             (PutWindow(5, lm - 9, lm - 1), Reason.TOO_LATE)]
    for pw, want in cases:
        got, nbytes = fetch_payload(r, alice.bucket, key, codec, Expect.from_hparams(hp, 5, uid=1), pw, FAR)
        if want is None:
            assert isinstance(got, Payload), (pw, got)
        else:
            assert isinstance(got, Rejection) and got.reason is want and nbytes == 0, (pw, got)


# ------------------------------------------------ checkpoints, aggregates, peers, cleanup
def test_checkpoint_latest_pointer_and_tampering(alice, hp, shapes):
    model = build_model(hp.model, hp.seed)
    w, r = alice.write_client(), alice.read_client()
    pointer = save_checkpoint(w, alice.bucket, model, 10, hp)
    assert pointer.key == keys.checkpoint(10, hp.protocol_version)
    assert read_latest(r, alice.bucket, hp.protocol_version) == pointer
    ckpt = load_latest_checkpoint(r, alice.bucket, shapes, hp)
    assert not isinstance(ckpt, Rejection), ckpt
    fresh = build_model(hp.model, hp.seed + 1)
    ckpt.load_into(fresh)
    ckpt.close()
    assert model_hash(fresh) == model_hash(model) == ckpt.model_hash

    shard = keys.checkpoint_shard(10, 0, hp.protocol_version)  # one shard: the model is small
    data = bytearray(r.get(alice.bucket, shard))
    data[-5] ^= 0x01  # one bit of the last tensor's values
    w.put(alice.bucket, shard, bytes(data))
    got = load_latest_checkpoint(r, alice.bucket, shapes, hp)
    assert isinstance(got, Rejection) and got.reason is Reason.METADATA_MISMATCH and "sha256" in got.detail

    w.put(alice.bucket, keys.latest_checkpoint(hp.protocol_version),
          json.dumps({"window": 10, "version": hp.protocol_version, "key": "../../etc/passwd",
                      "model_hash": "0" * 64}).encode())
    assert read_latest(r, alice.bucket, hp.protocol_version).reason is Reason.MALFORMED


def test_bundle_and_peers_objects(alice, hp, codec):
    w, r = alice.write_client(), alice.read_client()
    run = "00112233445566ff"
    data = encode_bundle(codec, 6, [], {}, "a" * 64, "b" * 64, hp.protocol_version, hp.digest(),
                         "c" * 64, "d" * 64)
    put_bundle(w, alice.bucket, data, 6, hp.protocol_version, run)
    bundle = get_bundle(r, alice.bucket, codec, hp, 6, run)
    assert not isinstance(bundle, Rejection) and bundle.model_hash_after == "b" * 64
    assert get_bundle(r, alice.bucket, codec, hp, 7, run).reason is Reason.MISSING
    assert get_bundle(r, alice.bucket, codec, hp, 6).reason is Reason.MISSING  # another run's (unscoped) key
    put_peers(w, alice.bucket, PeersList(6, hp.protocol_version, (3, 1, 2)))
    assert get_peers(r, alice.bucket, 6, hp.protocol_version).uids == (3, 1, 2)
    w.put(alice.bucket, keys.peers(8, hp.protocol_version), b"{" * 10)
    assert get_peers(r, alice.bucket, 8, hp.protocol_version).reason is Reason.MALFORMED


def test_cleanup_deletes_only_own_expired_objects(s3, hp):
    erin = s3.provision("erin")
    w = erin.write_client()
    v = hp.protocol_version
    for win in range(8):
        w.put(erin.bucket, keys.gradient(win, 4, v), b"g")
    for win in (0, 3):
        w.put(erin.bucket, keys.checkpoint(win, v), b"c")
    w.put(erin.bucket, keys.latest_checkpoint(v), b"{}")
    w.put(erin.bucket, "notes/readme.txt", b"keep")
    deleted = cleanup(w, erin.bucket, current_window=8, retention_windows=2)
    assert deleted == sorted([keys.gradient(win, 4, v) for win in range(6)] + [keys.checkpoint(0, v)])
    remaining = {o.key for o in w.list(erin.bucket)}
    assert remaining == {keys.gradient(6, 4, v), keys.gradient(7, 4, v), keys.checkpoint(3, v),
                         keys.latest_checkpoint(v), "notes/readme.txt"}
