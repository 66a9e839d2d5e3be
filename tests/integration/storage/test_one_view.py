"""One view of each window: a peer that deletes or rewrites its object after the put window cannot split the
network.

Before the window's bundle existed, miners gathered the listed peers themselves, a little earlier than the
validator.  A peer that deleted its object, or replaced it with another valid update, in between was
aggregated by one side and not by the other (or with other content), and honest miners ended the window on
another θ_{t+1} than the validator.  The first half of the test reproduces that split with two gathers; the
second shows that a node applying the leader's bundle ends exactly on the validator's model.
"""
from __future__ import annotations

import time

import torch

from dso.nn.model import build_model, model_hash
from dso.protocol.clock import PutWindow
from dso.training.outer import OuterState
from neurons.catchup import apply_bundle
from neurons.engine import aggregate_window
from st_craft import honest
from storage import keys
from storage.aggregate import encode_bundle, get_bundle, put_bundle
from storage.gather import GatherOptions, ReaderCache, gather
from storage.wire import Expect

WINDOW, RUN = 9, "0a1b2c3d4e5f6789"
LOOPBACK = ReaderCache(allow_loopback=True)  # the embedded server lives on loopback


def test_rewriting_after_the_put_window_splits_gatherers_but_not_bundle_followers(s3, codec, make_update, hp):
    peers = {uid: s3.provision(f"view{uid}") for uid in (1, 2, 3)}
    v = hp.protocol_version

    def upload(uid: int, seed: int) -> None:
        c = peers[uid]
        c.write_client().put(c.bucket, keys.gradient(WINDOW, uid, v, RUN), honest(codec, make_update(seed), hp, uid,
                                                                                   WINDOW))

    for uid in peers:
        upload(uid, uid)
    now = time.time()
    put = PutWindow(WINDOW, now - 60.0, now + 30.0)  # the open edge is not under test here
    commitments = {uid: c.read_info() for uid, c in peers.items()}
    expect = Expect.from_hparams(hp, WINDOW, run=RUN)
    order = [3, 1, 2]

    # the validator: gather, aggregate θ_t → θ_{t+1}, publish the bundle
    validator_model = build_model(hp.model, hp.seed)
    seen = gather(WINDOW, commitments, codec, expect, put, 10.0, GatherOptions(readers=LOOPBACK))
    assert sorted(seen.payloads) == [1, 2, 3]
    agg = aggregate_window(validator_model, codec, hp, WINDOW, seen.payloads, order, OuterState.fresh(codec.shapes, hp))
    leader = s3.provision("view-leader")
    put_bundle(leader.write_client(), leader.bucket, encode_bundle(codec, WINDOW, agg.used, agg.payloads,
                                                                   agg.hash_before, agg.hash_after, v, hp.digest(),
                                                                   agg.outer_before, agg.outer_after),
               WINDOW, v, RUN)

    # then peer 3 deletes its object and peer 2 replaces its own with another valid update
    peers[3].write_client().delete(peers[3].bucket, [keys.gradient(WINDOW, 3, v, RUN)])
    upload(2, 99)

    # a node that gathers for itself now sees another window
    gatherer = build_model(hp.model, hp.seed)
    later = gather(WINDOW, commitments, codec, expect, put, 10.0, GatherOptions(readers=LOOPBACK))
    assert sorted(later.payloads) == [1, 2]
    aggregate_window(gatherer, codec, hp, WINDOW, later.payloads, order, OuterState.fresh(codec.shapes, hp))
    assert model_hash(gatherer) != model_hash(validator_model)  # the split

    # a node that applies the leader's bundle ends exactly on the validator's model
    follower = build_model(hp.model, hp.seed)
    bundle = get_bundle(leader.read_client(), leader.bucket, codec, hp, WINDOW, RUN)
    assert bundle.uids == [3, 1, 2]
    outer = OuterState.fresh(codec.shapes, hp)
    assert apply_bundle(follower, codec, hp, bundle, outer) is None
    assert model_hash(follower) == model_hash(validator_model) == bundle.model_hash_after
    assert outer.digest() == bundle.outer_digest_after == agg.outer_after
    # and a node that is not at the bundle's starting model is told so, not silently moved
    assert apply_bundle(follower, codec, hp, bundle, outer).reason.value == "metadata_mismatch"
    assert torch.equal(next(follower.parameters()), next(validator_model.parameters()))
