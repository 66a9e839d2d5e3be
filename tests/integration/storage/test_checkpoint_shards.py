"""Sharded checkpoints in S3 (storage/checkpoint.py, storage/checkpoint_manifest.py), on every S3 engine.

A checkpoint of the 4.3 M default model cut into 5 MiB shards, each sent with a multipart upload: it loads
into another model bit for bit, any slice of it reads as a rank of any group size would read it, a save
in the background gives the same objects, and loading holds at most about a shard besides the model.
Every check of the loader rejects its forgery — a flipped byte, a shard the manifest does not name, pieces
that do not tile the model, non-finite values behind a matching hash, other values behind the manifest's
model hash, an outer state that does not match its digest — and a rejected checkpoint changes nothing.
"""
from __future__ import annotations

import hashlib
import json
import math
import tracemalloc

import numpy as np
import pytest
import safetensors.numpy
import torch

from dso.config.schema import HParams
from dso.distributed.sharding import slice_range
from dso.nn.model import build_model, model_hash, parameter_shapes
from dso.protocol.rejections import Reason, Rejection
from dso.training.outer import OuterState
from storage import keys
from storage.checkpoint import CheckpointSaver, load_checkpoint, load_latest_checkpoint, save_checkpoint
from storage.checkpoint_manifest import plan_shards
from storage.cleanup import expired_keys
from storage.client import MiB

SHARD = 5 * MiB  # the smallest part S3 accepts in a multipart upload


@pytest.fixture(scope="module")
def big():
    hp = HParams()
    hp.outer.rule = "nesterov"  # an outer state with a momentum per parameter, to shard as well
    model = build_model(hp.model, hp.seed)
    shapes = parameter_shapes(model)
    outer = OuterState.fresh(shapes, hp)
    outer.steps = 3
    for n, m in outer.momentum.items():
        m.copy_(torch.randn(m.shape, generator=torch.Generator().manual_seed(len(n))))
    return hp, model, shapes, outer


@pytest.fixture(scope="module")
def carol(s3):
    return s3.provision("carol")


@pytest.fixture(scope="module")
def saved(carol, big):
    hp, model, _, outer = big
    writer = carol.write_client(multipart_threshold=SHARD, multipart_chunksize=SHARD)
    return save_checkpoint(writer, carol.bucket, model, 10, hp, outer=outer, shard_bytes=SHARD)


def manifest_of(carol, hp, window=10) -> dict:
    return json.loads(carol.read_client().get(carol.bucket, keys.checkpoint(window, hp.protocol_version)))


def test_shards_tile_the_model_and_load_bit_for_bit(carol, big, saved):
    hp, model, shapes, outer = big
    manifest = manifest_of(carol, hp)
    total = sum(4 * math.prod(s) for s in shapes.values()) * 2  # parameters and momentum
    assert len(manifest["shards"]) == math.ceil(total / SHARD) and all(s["size"] < SHARD + 4096
                                                                     for s in manifest["shards"])
    got = load_latest_checkpoint(carol.read_client(), carol.bucket, shapes, hp)
    assert not isinstance(got, Rejection), got
    fresh = build_model(hp.model, hp.seed + 1)
    got.load_into(fresh)
    assert model_hash(fresh) == model_hash(model) == got.model_hash == saved.model_hash
    assert got.outer.digest() == outer.digest() and got.outer.steps == 3
    got.close()


@pytest.mark.parametrize("world", [2, 3])
def test_any_number_of_ranks_reads_its_own_slices(carol, big, saved, world):
    hp, model, shapes, _ = big
    got = load_checkpoint(carol.read_client(), carol.bucket, 10, shapes, hp)
    for name, p in model.named_parameters():
        for dim in range(p.dim()):
            for rank in range(world):
                start, end = slice_range(p.shape[dim], rank, world)
                want = p.detach().narrow(dim, start, end - start)
                assert torch.equal(got.read(name, dim, start, end), want), (name, dim, rank)
    got.close()


def test_a_background_save_writes_the_same_checkpoint(carol, big, saved):
    hp, model, shapes, outer = big
    saver = CheckpointSaver(carol.write_client(), carol.bucket, shard_bytes=SHARD)
    saver.start(model, 11, hp, "", outer)
    pointer = saver.wait()
    assert pointer is not None and pointer.model_hash == saved.model_hash and len(saver.stalls) == 1
    a, b = manifest_of(carol, hp, 10), manifest_of(carol, hp, 11)
    assert [s["sha256"] for s in a["shards"]] != [s["sha256"] for s in b["shards"]]  # the window is in each
    assert [s["pieces"] for s in a["shards"]] == [s["pieces"] for s in b["shards"]]


def test_loading_holds_about_one_shard_besides_the_model(carol, big, saved):
    hp, model, shapes, _ = big
    target = build_model(hp.model, hp.seed + 1)
    tracemalloc.start()
    got = load_checkpoint(carol.read_client(), carol.bucket, 10, shapes, hp)
    got.load_into(target)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    got.close()
    model_bytes = sum(4 * p.numel() for p in model.parameters())
    assert model_hash(target) == model_hash(model)
    # the shard's bytes, its arrays and the momentum kept for the outer state's check; never the whole model twice
    assert peak < 3 * SHARD + model_bytes, (peak / MiB, model_bytes / MiB)


def test_shard_plan_cuts_large_tensors_by_rows():
    pieces = plan_shards([("a", "float32", (10, 4)), ("b", "float32", (3,)), ("c", "int64", (1,))], 48)
    assert [[(p.name, p.start, p.end) for p in s] for s in pieces] == [
        [("a", 0, 3)], [("a", 3, 6)], [("a", 6, 9)], [("a", 9, 10), ("b", 0, 3), ("c", 0, 1)]]


# ------------------------------------------------------------ forgeries
def _forge(carol, hp, mutate) -> None:
    """Rewrite window 12's checkpoint as ``mutate(manifest, shards)`` leaves it (shards: key → bytes)."""
    w, r = carol.write_client(multipart_threshold=SHARD, multipart_chunksize=SHARD), carol.read_client()
    manifest = manifest_of(carol, hp, 12)
    shards = {s["key"]: r.get(carol.bucket, s["key"]) for s in manifest["shards"]}
    mutate(manifest, shards)
    for key, data in shards.items():
        w.put(carol.bucket, key, data)
    w.put(carol.bucket, keys.checkpoint(12, hp.protocol_version), json.dumps(manifest).encode())


def _resign(manifest, shards, index, arrays, metadata) -> None:
    """A consistent forger: new shard bytes and their sha256 and size in the manifest."""
    data = safetensors.numpy.save(arrays, metadata=metadata)
    entry = manifest["shards"][index]
    shards[entry["key"]] = data
    entry["sha256"], entry["size"] = hashlib.sha256(data).hexdigest(), len(data)


def _first_shard(shards, manifest):
    data = shards[manifest["shards"][0]["key"]]
    meta = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])["__metadata__"]
    return dict(safetensors.numpy.load(data)), meta


def _flip(manifest, shards):
    key = manifest["shards"][1]["key"]
    data = bytearray(shards[key])
    data[-7] ^= 1
    shards[key] = bytes(data)


def _foreign_key(manifest, shards):
    manifest["shards"][0]["key"] = "elsewhere/evil.safetensors"


def _gap(manifest, shards):
    manifest["shards"][0]["pieces"][0][2] -= 1


def _nan(manifest, shards):
    arrays, meta = _first_shard(shards, manifest)
    name = next(iter(arrays))
    arrays[name] = arrays[name].copy()
    arrays[name].reshape(-1)[0] = np.nan
    _resign(manifest, shards, 0, arrays, meta)


def _other_values(manifest, shards):
    arrays, meta = _first_shard(shards, manifest)
    name = next(iter(arrays))
    arrays[name] = arrays[name] * np.float32(1.5)
    _resign(manifest, shards, 0, arrays, meta)


def _extra_tensor(manifest, shards):
    arrays, meta = _first_shard(shards, manifest)
    arrays["smuggled"] = np.zeros(3, np.float32)
    _resign(manifest, shards, 0, arrays, meta)


def _outer_digest(manifest, shards):
    manifest["outer_digest"] = "0" * 64


@pytest.mark.parametrize("mutate,reason,words", [
    (_flip, Reason.METADATA_MISMATCH, "sha256"),
    (_foreign_key, Reason.MALFORMED, "key does not match"),
    (_gap, Reason.BAD_KEYS, "expected"),
    (_nan, Reason.NON_FINITE, "non-finite"),
    (_other_values, Reason.METADATA_MISMATCH, "model hash mismatch"),
    (_extra_tensor, Reason.BAD_KEYS, "extra"),
    (_outer_digest, Reason.METADATA_MISMATCH, "outer"),
])
def test_every_forgery_is_rejected_and_changes_nothing(carol, big, mutate, reason, words):
    hp, model, shapes, outer = big
    writer = carol.write_client(multipart_threshold=SHARD, multipart_chunksize=SHARD)
    save_checkpoint(writer, carol.bucket, model, 12, hp, outer=outer, shard_bytes=SHARD)
    _forge(carol, hp, mutate)
    target = build_model(hp.model, hp.seed + 1)
    before = model_hash(target)
    got = load_checkpoint(carol.read_client(), carol.bucket, 12, shapes, hp)
    assert isinstance(got, Rejection) and got.reason is reason and words in got.detail, got
    assert model_hash(target) == before


def test_cleanup_keeps_the_newest_checkpoint_with_its_shards():
    v = 1
    names = [keys.checkpoint(3, v), keys.checkpoint_shard(3, 0, v), keys.checkpoint_shard(3, 1, v),
             keys.checkpoint(9, v), keys.checkpoint_shard(9, 0, v), keys.latest_checkpoint(v)]
    assert expired_keys(names, 100, 10) == sorted(names[:3])
    assert keys.parse(keys.checkpoint_shard(9, 1, v)).kind == "checkpoint_shard"
