"""A miner's θ held as slices on two ranks (dso/distributed/sliced_theta.py) follows the network exactly as one
process's model does.

Rank 0 leads (neurons/ranks.py orders), rank 1 carries out its θ operations.  From θ_0 streamed into the
slices, the leader applies four windows of bundles that a validator in the same process aggregated on its
whole model (neurons/catchup.py ``apply_bundle`` on the slices), then catches up from the validator's
checkpoint of window 2 (S3, read slice by slice) and replays the last two bundles.  Checks: after every
window the slices' hash is the validator's θ_{t+1} hash and its outer state the same; the SyncScore samples
read from the slices equal those read from the whole model; a bundle for another θ is refused and changes
nothing; the checkpoint lands on its hash and the replay on the validator's θ_4.
"""
from __future__ import annotations

import pytest
import torch
from unit.neurons.test_outer_consensus import PEERS, _payloads  # a window's payloads from three peers

from s3_engines import start_s3_engine
from sim.ranks import run_ranks

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # gloo/FSDP warnings in the rank processes
WINDOWS = 4


@pytest.fixture(scope="module")
def bucket(request):
    engine, stop = start_s3_engine(request, "moto")
    yield engine.provision("validator")
    if stop is not None:
        stop()


def _follow(hp, bucket) -> dict | None:
    from dso.codec.codecs import make_codec
    from dso.distributed.fsdp import codec_shard_dims, shapes_of
    from dso.distributed.ranks import join_group
    from dso.distributed.sliced_theta import SlicedTheta
    from neurons.ranks import Orders, follow_orders
    from sim.scale import ranked_loop

    ranks = join_group("cpu")
    codec = make_codec(shapes_of(hp.model), hp)
    dims = codec_shard_dims(codec, ranks.world)
    loop = ranked_loop(hp, ranks, dims)  # θ_0, streamed into the anchor slices a tensor at a time
    if not ranks.leader:
        follow_orders(ranks, {"theta": SlicedTheta(loop.anchor, codec.shapes, dims, ranks, hp)})
        return None
    orders = Orders(ranks)
    theta = SlicedTheta(loop.anchor, codec.shapes, dims, ranks, hp, orders.announcer("theta"))
    try:
        return _lead(hp, codec, theta, bucket)
    finally:
        orders.stop()


def _lead(hp, codec, theta, bucket) -> dict:
    from dso.nn.model import build_model, model_hash, sync_sample_count
    from dso.training.outer import OuterState
    from neurons.catchup import apply_bundle
    from neurons.engine import aggregate_window
    from scoring.sync import sample_parameters, sync_positions
    from storage.aggregate import Bundle
    from storage.checkpoint import load_checkpoint, save_checkpoint

    validator = build_model(hp.model, hp.seed)  # the one-process reference: a validator's whole model
    v_outer, outer = OuterState.fresh(codec.shapes, hp), OuterState.fresh(codec.shapes, hp)
    out: dict = {"theta_0": (theta.hash(), model_hash(validator)), "windows": [], "samples_equal": []}
    bundles = []
    for t in range(WINDOWS):
        if t == 2:
            save_checkpoint(bucket.write_client(), bucket.bucket, validator, t, hp, outer=v_outer)
        agg = aggregate_window(validator, codec, hp, t, _payloads(hp, validator, codec, t), PEERS, v_outer)
        bundles.append(Bundle(t, agg.used, agg.payloads, agg.hash_before, agg.hash_after, agg.outer_before,
                              agg.outer_after))
        refused = apply_bundle(theta, codec, hp, bundles[-1], outer)
        positions = sync_positions(bytes([t + 1]) * 32, codec.shapes, sync_sample_count(hp))
        out["samples_equal"].append(torch.equal(theta.sample(positions),
                                                sample_parameters(dict(validator.named_parameters()), positions)))
        out["windows"].append((refused, theta.hash(), agg.hash_before, agg.hash_after,
                               outer.digest() == v_outer.digest()))
    out["stale"] = apply_bundle(theta, codec, hp, bundles[1], outer)  # θ_4 is not that bundle's θ_1
    out["after_stale"] = theta.hash()
    ckpt = load_checkpoint(bucket.read_client(), bucket.bucket, 2, dict(codec.shapes), hp)
    theta.load_checkpoint(ckpt)
    out["checkpoint"] = (theta.hash(), ckpt.model_hash)
    outer = ckpt.outer
    ckpt.close()
    out["replayed"] = [apply_bundle(theta, codec, hp, b, outer) for b in bundles[2:]]
    out["caught_up"] = (theta.hash(), model_hash(validator), outer.digest() == v_outer.digest())
    return out


@pytest.mark.parametrize("rule", ["signed", "nesterov"])
def test_sliced_theta_follows_bundles_and_catches_up_as_one_process(tiny_hparams, bucket, rule):
    from dso.codec.codecs import make_codec
    from dso.distributed.fsdp import codec_shard_dims, shapes_of

    hp = tiny_hparams
    hp.outer.rule, hp.outer.lr = rule, 0.5
    hp.model.ffn_hidden = 48  # 24 rows a rank is no whole number of 16-row chunks: w_gate and w_up slice by column
    assert set(codec_shard_dims(make_codec(shapes_of(hp.model), hp), 2).values()) == {0, 1}
    got = run_ranks(_follow, 2, hp, bucket, timeout=300)[0]
    mine, reference = got["theta_0"]
    assert mine == reference  # θ_0 streamed tensor by tensor: build_model's θ_0
    for t, (refused, hashed, before, after, same_outer) in enumerate(got["windows"]):
        assert refused is None, (t, refused)
        assert hashed == after != before and same_outer, t  # θ_{t+1}: the validator's bits, and its outer state
    assert all(got["samples_equal"]) and len(got["samples_equal"]) == WINDOWS
    assert got["stale"] is not None and got["stale"].reason.value == "metadata_mismatch"
    assert got["after_stale"] == got["windows"][-1][1]  # refused before anything moved
    loaded, manifest = got["checkpoint"]
    assert loaded == manifest == got["windows"][1][3]  # θ_2, read slice by slice from the verified shards
    assert got["replayed"] == [None, None]
    hashed, reference, same_outer = got["caught_up"]
    assert hashed == reference == got["windows"][-1][1] and same_outer
