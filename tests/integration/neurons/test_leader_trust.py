"""A leader nobody has to trust, with real nodes in-process (production wiring, the embedded S3 server,
a LocalChain): three validators by stake (the first one lies), four miners publishing signed payloads.

The leader's bundle forges a payload (negated, under its miner's signature), includes one the others rejected,
and drops the best one.  A validator that does not lead compares it with its own gather and list, refuses it in
one log line, and — next by stake — aggregates its own selection; the third takes that one's bundle after
checking it; a miner applies only a bundle whose every payload its miner signed, so it ends on the same model;
with no valid bundle at all it gathers the list's signed payloads itself."""
from __future__ import annotations

import copy
import logging
import time
from dataclasses import replace

import pytest
import torch

from dso.chain.local import LocalChain
from dso.chain.local_burn import FREE_REGISTRATION
from dso.chain.wallets import create_local_wallet, hotkey_address
from dso.data.dataset import Dataset
from dso.nn.model import model_hash
from dso.protocol.payload import PayloadMeta
from dso.protocol.rejections import Reason, Rejection
from embedded_nodes import node_config
from embedded_nodes import tiny_node_hparams as tiny
from neurons.context import NodeContext, build_context
from neurons.engine import aggregate_window
from neurons.follow import Follower
from neurons.leader_check import choose_bundle, compare
from neurons.publish import publish_payload
from sim import behaviours
from storage import keys
from storage.aggregate import Bundle, encode_bundle, get_bundle, put_bundle, unsigned
from storage.gather import GatherOptions, gather
from storage.peers import PeersList, put_peers
from storage.server import EmbeddedS3
from storage.wire import Expect, encode_payload

RUN = "1ead1ead1ead1ead"
STAKES = {"v0": 1000.0, "v1": 400.0, "v2": 200.0}
MINERS = ("m0", "m1", "m2", "m3")
BLOCK_TIME = 0.25


def settle(chain: LocalChain, contexts) -> None:
    target = chain.block() + 2
    while chain.block() < target:
        time.sleep(BLOCK_TIME / 4)
    for ctx in contexts:
        ctx.chain.invalidate()


def post_lately(chain: LocalChain, nodes: dict[str, NodeContext]) -> None:
    """Live validators: each posts weights (a self-weight) now — a validator idle for leader_idle_blocks leads no
    longer, and a loaded machine can spend that long on one test."""
    for name in STAKES:
        chain.set_weights(nodes[name].wallet, [nodes[name].uid], [1.0])
    settle(chain, nodes.values())


def publish_all(nodes: dict[str, NodeContext], t: int, seed: int) -> None:
    """Each miner publishes a signed payload of window t (random update, sync samples 0)."""
    gen = torch.Generator().manual_seed(seed)
    for name in MINERS:
        ctx = nodes[name]
        update = ctx.codec.compress({n: torch.randn(s, generator=gen) for n, s in ctx.codec.shapes.items()}, t)
        meta = PayloadMeta(ctx.uid, t, ctx.hp.protocol_version, ctx.hp.digest(), ctx.dataset.data_hash,
                           model_hash(ctx.model))
        assert publish_payload(ctx, t, encode_payload(ctx.codec, update, torch.zeros(ctx.hp.sync_samples), meta),
                               lead=0.0)


@pytest.fixture(scope="module")
def net(tmp_path_factory, stdlib_corpus):
    root = tmp_path_factory.mktemp("leader")
    hp, cache = tiny(), str(root / "cache")
    hp.data_hash = Dataset.for_run(hp, str(stdlib_corpus), cache).data_hash
    with EmbeddedS3.start() as s3:
        chain = LocalChain.create(root / "chain.sqlite", block_time=BLOCK_TIME, tempo=10_000, commit_interval_blocks=0,
                                  immunity_blocks=10_000, **FREE_REGISTRATION)
        wallets = str(root / "wallets")
        nodes: dict[str, NodeContext] = {}
        for name in (*STAKES, *MINERS):
            wallet = create_local_wallet(name, "default", wallets)
            chain.register(wallet)
            if name in STAKES:
                chain.add_stake(hotkey_address(wallet), STAKES[name])
            cfg = node_config(root, s3, name, wallets, str(stdlib_corpus), cache, hp, allow_loopback_endpoints=True)
            nodes[name] = build_context(cfg, "validator" if name in STAKES else "miner", handle_signals=False)
            nodes[name].run = RUN
        post_lately(chain, nodes)
        yield chain, nodes


def test_validators_refuse_a_lying_leader_and_every_honest_node_ends_on_one_model(net, caplog):
    chain, nodes = net
    v0, v1, v2, miner = nodes["v0"], nodes["v1"], nodes["v2"], nodes["m0"]
    assert v0.peers.sources() == [v0.uid, v1.uid, v2.uid]  # the leader first
    t = v0.clock.current_window()
    uids = {name: nodes[name].uid for name in MINERS}
    publish_all(nodes, t, seed=5)
    expect = Expect.from_hparams(v1.hp, t, run=RUN, data_hash=v1.dataset.data_hash)
    commitments = v1.peers.commitments()
    read = gather(t, {u: commitments[u] for u in uids.values()}, v1.codec, expect, None, 30,
                  GatherOptions(readers=v1.readers, hotkeys=v1.peers.hotkeys()))
    assert sorted(read.payloads) == sorted(uids.values()), read.rejections
    # the honest validators' view: m3's upload came too late; their list is m0 (the best), m1, m2, m3
    ours = {u: p for u, p in read.payloads.items() if u != uids["m3"]}
    rejected = {uids["m3"]: Rejection(Reason.TOO_LATE, "LastModified after the close")}
    listed = [uids[m] for m in MINERS]
    # the lie: drop m0, forge m1, include m3 — and apply it, so the leader's hashes are consistent
    lie = {uids["m1"]: behaviours.forged_payload(v0.codec, read.payloads[uids["m1"]]),
           uids["m2"]: read.payloads[uids["m2"]], uids["m3"]: read.payloads[uids["m3"]]}
    agg = aggregate_window(v0.model, v0.codec, v0.hp, t, lie, listed, v0.outer, v0.device)
    put_bundle(v0.own.client, v0.own.bucket, encode_bundle(v0.codec, t, agg.used, agg.payloads, agg.hash_before,
                                                           agg.hash_after, v0.hp.protocol_version, v0.hp.digest(),
                                                           agg.outer_before, agg.outer_after), t,
               v0.hp.protocol_version, RUN)

    # the second validator by stake refuses it in one line, and is the next to follow: it aggregates its own list
    caplog.set_level(logging.WARNING, logger="dso.follow")
    follow1 = Follower(v1)
    chosen, check = choose_bundle(v1, follow1, t, ours, rejected, listed, time.time() + 5)
    assert chosen is None and check is not None and check.refuse
    assert check.counts() == {"forged": 1, "included_rejected": 1, "differs": 0, "unverified": 0, "dropped": 1,
                              "unselected": 0}
    assert check.forged.keys() == {uids["m1"]} and check.included_rejected == {uids["m3"]: "too_late"}
    assert check.dropped == [uids["m0"]] and check.to_dict()["refused"] is True
    refusals = [r.getMessage() for r in caplog.records if "not following validator" in r.getMessage()]
    assert len(refusals) == 1 and f"uid {v0.uid}" in refusals[0] and "not signed by its miner" in refusals[0]
    assert v1.peers.sources() == [v1.uid, v2.uid]  # the liar is passed over from now on
    restarted = build_context(v1.cfg, "validator", handle_signals=False)  # and after a restart
    assert restarted.uid == v1.uid and restarted.peers.distrusted == {v0.uid}
    honest = aggregate_window(v1.model, v1.codec, v1.hp, t, ours, listed, v1.outer, v1.device)
    data = encode_bundle(v1.codec, t, honest.used, honest.payloads, honest.hash_before, honest.hash_after,
                         v1.hp.protocol_version, v1.hp.digest(), honest.outer_before, honest.outer_after)
    put_bundle(v1.own.client, v1.own.bucket, data, t, v1.hp.protocol_version, RUN)

    # the third refuses the liar too and takes the second's bundle, checked against its own view
    chosen, check = choose_bundle(v2, Follower(v2), t, ours, rejected, listed, time.time() + 5)
    assert isinstance(chosen, Bundle) and chosen.model_hash_after == honest.hash_after and check.refuse
    # a validator whose own scores rank m2 out of its selection counts it, and still follows the bundle
    scored_apart = compare(chosen, v1.uid, ours, rejected, [uids["m0"], uids["m1"]], v2.peers.hotkeys(), RUN)
    assert scored_apart.unselected == [uids["m2"]] and not scored_apart.refuse, scored_apart
    assert scored_apart.counts() == {"forged": 0, "included_rejected": 0, "differs": 0, "unverified": 0,
                                     "dropped": 0, "unselected": 1}
    # a miner: the leader's bundle holds a payload no miner signed; it applies the next validator's
    follow_m = Follower(miner)
    got = follow_m.bundle(t, time.time() + 5)
    assert isinstance(got, Bundle) and got.model_hash_after == honest.hash_after, got
    applied, summary = follow_m.apply(t, got)
    assert applied and model_hash(miner.model) == honest.hash_after != agg.hash_after, summary
    assert v0.uid in miner.peers.distrusted and t in follow_m.refused


def test_a_follower_with_no_valid_bundle_gathers_the_signed_payloads_itself(net):
    """Only a forged bundle exists for the window: the miner refuses it, waits in vain for another, then gathers
    the list's payloads (signature checked) and aggregates them as the leader should have."""
    chain, nodes = net
    v0, miner = nodes["v0"], nodes["m1"]
    post_lately(chain, nodes)
    miner.peers.distrusted.clear()
    t = v0.clock.current_window() + 1
    while v0.clock.current_window() < t:
        time.sleep(BLOCK_TIME / 2)
    uids = [nodes[m].uid for m in MINERS]
    publish_all(nodes, t, seed=9)
    read = gather(t, {u: v0.peers.commitments()[u] for u in uids}, v0.codec,
                  Expect.from_hparams(v0.hp, t, run=RUN, data_hash=v0.dataset.data_hash), None, 30,
                  GatherOptions(readers=v0.readers, hotkeys=v0.peers.hotkeys()))
    payloads = dict(read.payloads)
    forged = {**payloads, uids[0]: behaviours.forged_payload(v0.codec, payloads[uids[0]])}
    before = model_hash(miner.model)
    put_bundle(v0.own.client, v0.own.bucket, encode_bundle(v0.codec, t, uids, forged, before, "e" * 64,
                                                           v0.hp.protocol_version, v0.hp.digest(), miner.outer.digest(),
                                                           "f" * 64), t, v0.hp.protocol_version, RUN)
    for name in ("v0", "v1"):  # the list of window t, published by the leader and the next validator alike
        put_peers(nodes[name].own.client, nodes[name].own.bucket, PeersList(t, v0.hp.protocol_version, tuple(uids)),
                  RUN)
    follow = Follower(miner)
    got = follow.bundle(t, time.time() + 1.0)
    assert isinstance(got, Rejection) and got.reason == Reason.MISSING, got  # the next validator has none either
    assert "not signed" in follow.refused[t] and v0.uid in miner.peers.distrusted
    # the fallback gathers with a put window around now: these uploads are inside it
    miner.clock.put_window = lambda w: replace(miner.clock.__class__.put_window(miner.clock, w),  # type: ignore
                                               open=time.time() - 30, close=time.time() + 30)
    reference, reference_outer = copy.deepcopy(miner.model), copy.deepcopy(miner.outer)
    applied, summary = follow.apply(t, got)
    assert applied and "gathered" in summary, summary
    expected = aggregate_window(reference, miner.codec, miner.hp, t, payloads, uids, reference_outer, miner.device)
    assert expected.hash_before == before and model_hash(miner.model) == expected.hash_after


def test_a_bundle_payload_keeps_its_bytes_and_signature_and_each_forgery_is_named(net):
    """The bundle carries each payload's exact bytes and its miner's signature; `unsigned` names the uid of a
    negated payload, of one with no signature and of one whose uid's hotkey is not the signer."""
    _, nodes = net
    v0 = nodes["v0"]
    t = v0.clock.current_window() + 7  # objects of a window no other test uses
    uids = [nodes[m].uid for m in MINERS]
    publish_all(nodes, t, seed=3)
    hotkeys = v0.peers.hotkeys()
    read = gather(t, {u: v0.peers.commitments()[u] for u in uids}, v0.codec,
                  Expect.from_hparams(v0.hp, t, run=RUN, data_hash=v0.dataset.data_hash), None, 30,
                  GatherOptions(readers=v0.readers, hotkeys=hotkeys))
    payloads = dict(read.payloads)
    payloads[uids[0]] = behaviours.forged_payload(v0.codec, payloads[uids[0]])
    payloads[uids[1]].signature = ""
    data = encode_bundle(v0.codec, t, uids, payloads, "a" * 64, "b" * 64, v0.hp.protocol_version, v0.hp.digest(),
                         "c" * 64, "d" * 64)
    put_bundle(v0.own.client, v0.own.bucket, data, t, v0.hp.protocol_version, RUN)
    bundle = get_bundle(v0.own.client, v0.own.bucket, v0.codec, v0.hp, t, RUN)
    assert isinstance(bundle, Bundle)
    assert bundle.payloads[uids[2]].raw == read.payloads[uids[2]].raw
    assert bundle.payloads[uids[2]].signature == read.payloads[uids[2]].signature
    swapped = {**hotkeys, uids[3]: hotkeys[uids[2]]}  # uid 3's hotkey on chain is not the one that signed
    problems = unsigned(bundle, swapped, RUN)
    assert {u: r.reason for u, r in problems.items()} == {
        uids[0]: Reason.BAD_SIGNATURE, uids[1]: Reason.UNSIGNED, uids[3]: Reason.BAD_SIGNATURE}
    assert unsigned(bundle, hotkeys, "0" * 16).keys() == set(uids)  # signed for another run: none verifies
    check = compare(bundle, v0.uid, read.payloads, {}, uids, hotkeys, RUN)
    assert check.forged.keys() == {uids[0], uids[1]} and check.refuse
    assert keys.signature(t, uids[0], v0.hp.protocol_version, RUN).startswith(f"{RUN}/signature/{t}/")
