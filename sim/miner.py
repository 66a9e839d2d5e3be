"""Adversarial miners for the local network: the honest miner with a behaviour from sim/behaviours/.

    python -m sim.miner --behaviour noise [every neurons/miner.py flag]

:class:`AdversarialMiner` overrides the honest miner's steps (neurons/miner.py):
what it trains, what it uploads and when, and whether it follows the network.
Nothing in the production code paths knows about it (the core never imports
``sim``).
"""
from __future__ import annotations

import argparse
import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from dso.codec.demo import CompressedUpdate
from dso.config.schema import Config
from dso.config.sources import build_parser, parse_args
from dso.data.assignment import Assignment
from dso.protocol import signatures
from dso.protocol.clock import PutWindow, reveal_time, reveal_window_after
from dso.protocol.commit import new_nonce
from dso.protocol.payload import Payload, PayloadMeta
from dso.protocol.rejections import Rejection
from dso.training.outer import aggregate
from neurons import reveal
from neurons.context import build_context
from neurons.lifecycle import Fatal, run_main
from neurons.miner import Miner
from neurons.miner_upload import UPLOAD_MARGIN
from neurons.publish import publish_payload, sign
from sim import behaviours
from sim.forging_s3 import ForgingS3, shifted_by
from storage import keys, signature
from storage.aggregate import Bundle
from storage.client import StorageError
from storage.commitment import BucketInfo
from storage.gather import GatherOptions, gather
from storage.reveal import seal
from storage.wire import Expect, decode_payload, encode_payload

log = logging.getLogger("dso.sim.miner")
READ_AFTER_REVEALS = 0.5  # under commit-reveal, readers of others' updates read this long after reveals start
READ_EVERY = 0.1          # readers of others' updates look again this often until they find enough ...
COPY_UPLOAD_SECONDS = 0.3  # ... while this much is left before the uploads close (to build and upload theirs)


class AdversarialMiner(Miner):
    def __init__(self, ctx: Any, behaviour: str):
        if behaviour not in behaviours.BEHAVIOURS:
            raise Fatal(f"--behaviour {behaviour!r}: choose from {', '.join(behaviours.BEHAVIOURS)}")
        super().__init__(ctx)
        self.behaviour = behaviour
        self.acts = behaviours.make(behaviour)
        self.noise_gen = torch.Generator().manual_seed(ctx.hp.seed * 7919 + ctx.uid)
        self.sybil_dir = Path(ctx.cfg.neuron.state_dir).expanduser() / "sybil"
        self.opened: float | None = None  # the current put window's open (what a forger backdates to)

    def plan(self, t: int) -> behaviours.Plan:
        return self.acts.plan(t)

    def training_data(self, t: int) -> Assignment:
        ctx = self.ctx
        return Assignment.of(self.acts.training_data(ctx.dataset, ctx.uid, t, ctx.hp.assigned_sequences)
                             [:self.sequences])

    def meta(self, t: int) -> PayloadMeta:
        """The honest header, declaring what the behaviour claims it trained on."""
        claim = min(self.sequences, self.ctx.hp.assigned_sequences)
        return replace(super().meta(t), trained=self.acts.declared(self.report.sequences, claim))

    # ------------------------------------------------------ the three steps
    def train(self, t: int) -> tuple[CompressedUpdate | None, float]:
        plan = self.plan(t)
        if not plan.train:
            return None, float("nan")
        if self.ctx.hp.inner.mode == "gradient":  # paper mode: one gradient of plan.data_batches batches
            self.sequences = self.ctx.hp.batch_size * plan.data_batches
        return super().train(t)

    def upload(self, t: int, own: CompressedUpdate | None, put: PutWindow) -> bool:
        plan = self.plan(t)
        self.opened = put.open
        if not plan.upload or (self.privacy.stopped and plan.train):
            return False
        if not plan.late and time.time() >= put.close - UPLOAD_MARGIN:
            return False
        if self.ctx.hp.commit_reveal:
            return self.commit_then_reveal(t, plan, own, put)
        data = self.build(t, plan, own, put.open + 0.6, put.close)
        if data is None:
            return False
        if plan.late and not self.ctx.clock.sleep_until(put.close + plan.late_by, self.ctx.stop):
            return False
        return self.put_payload(t, data)

    def follow(self, t: int) -> str:
        plan = self.plan(t)
        if not plan.apply_aggregate:
            return "not following (desync)"
        if not plan.self_aggregate:  # replays the bundle later, when it catches up
            return "replaying the leader's bundles"
        return super().follow(t)

    def follows(self, t: int) -> bool:
        return self.plan(t).apply_aggregate

    def trains_ahead(self, t: int) -> bool:
        return self.plan(t).train and super().trains_ahead(t)

    def describe(self) -> dict[str, Any]:
        return {"behaviour": self.behaviour}

    # ------------------------------------------------------------ pieces
    def commit_then_reveal(self, t: int, plan: behaviours.Plan, own: CompressedUpdate | None,
                           put: PutWindow) -> bool:
        """Readers of others' updates can read nothing before commitments close: the best they can do is
        commit to a placeholder in time and reveal a copy, which cannot match the commitment."""
        ctx = self.ctx
        if plan.reads_peers:
            sealed = seal(new_nonce(), t, ctx.uid)
        else:
            data = self.build(t, plan, own, put.open + 0.6, put.close)
            if data is None:
                return False
            sealed = seal(data, t, ctx.uid, signature=sign(ctx, t, data) or "")
        if plan.late and not ctx.clock.sleep_until(put.close + plan.late_by, ctx.stop):
            return False
        if not reveal.commit(ctx, sealed):
            return False
        if plan.reads_peers:
            if not ctx.clock.sleep_until(reveal_time(put), ctx.stop):
                return False
            data = self.build(t, plan, own, reveal_time(put) + READ_AFTER_REVEALS, reveal_window_after(put).close)
            if data is None:
                return False
            # the copy with a fresh nonce, signed with our own key: it cannot match the commitment
            sealed = seal(data, t, ctx.uid, signature=sign(ctx, t, data) or "")
        return reveal.reveal(ctx, sealed, put)

    def build(self, t: int, plan: behaviours.Plan, own: CompressedUpdate | None, read_from: float,
              read_until: float) -> bytes | None:
        """The payload bytes this behaviour uploads for window t (None = nothing); behaviours that build on
        others' updates read them between ``read_from`` and ``read_until``."""
        ctx = self.ctx
        sync = self.sync_samples(t)
        if sync is None:
            return None
        others = self.read_payloads(t, read_from, read_until) if plan.reads_peers else []
        previous = self.previous_aggregate(t) if self.acts.needs_previous else None
        update = self.acts.upload(behaviours.Inputs(ctx.codec, t, own, self.noise_gen, [p.update for p in others],
                                                    previous))
        if self.acts.copies_sync and others:
            sync = others[0].sync_values  # a careful copier copies the victim's sync samples as well
        if self.acts.shares_update:
            update = self.sybil_update(t, update, sync, read_until)
        if update is None:
            return None
        return self.acts.wire(encode_payload(ctx.codec, update, sync, self.meta(t)), t)

    def read_payloads(self, t: int, start: float, until: float) -> list[Payload]:
        """Other miners' payloads of window t as readable between ``start`` and ``until``: read again every
        READ_EVERY seconds until there are enough to build on (honest payloads follow their signatures by
        a lead: storage.look.signature_lead), with time left to upload."""
        ctx = self.ctx
        ctx.clock.sleep_until(start, ctx.stop)
        others: dict[int, BucketInfo | str | None] = {
            u: c for u, c in ctx.peers.commitments().items() if u in ctx.peers.miners()}
        wanted = self.acts.peers_wanted
        while True:
            result = gather(t, others, ctx.codec, Expect.from_hparams(ctx.hp, t, run=ctx.run), None,
                            max(0.5, until - time.time() - 0.5), GatherOptions(readers=ctx.readers))
            self.follower.bytes += result.bytes_down
            if len(result.payloads) >= wanted or time.time() + READ_EVERY > until - COPY_UPLOAD_SECONDS or ctx.stop():
                break
            ctx.stop.sleep(READ_EVERY)
        log.info("window %d: %s read %d updates of others", t, self.behaviour, len(result.payloads))
        return [result.payloads[u] for u in sorted(result.payloads)]

    def put_payload(self, t: int, data: bytes) -> bool:
        """Signed with our own key; a copier gains nothing from waiting after its signature, so it does not; an
        upload late anyway puts its payload and its signature at once (both land when one plain upload would:
        what the late and hider tests were timed for)."""
        if self.plan(t).late:
            return self.put_late(t, data)
        if self.acts.reads_peers:  # copiers, mixers, ALIE and IPM
            return publish_payload(self.ctx, t, data, lead=0.0)
        return super().put_payload(t, data)

    def put_late(self, t: int, data: bytes) -> bool:
        ctx, v = self.ctx, self.ctx.hp.protocol_version
        sig = sign(ctx, t, data)
        if sig is None:
            return False
        failed: list[StorageError] = []

        def put(write: Any) -> None:
            try:
                write()
            except StorageError as e:
                failed.append(e)
        writers = [threading.Thread(target=put, args=(lambda: ctx.own.client.put(
                       ctx.own.bucket, keys.gradient(t, ctx.uid, v, ctx.run), data),)),
                   threading.Thread(target=put, args=(lambda: signature.put(
                       ctx.own.client, ctx.own.bucket, ctx.run, t, ctx.uid, v, signatures.digest(data), sig),))]
        for w in writers:
            w.start()
        for w in writers:
            w.join()
        if failed:
            log.warning("window %d: upload failed: %s", t, failed[0])
        return not failed

    def previous_aggregate(self, t: int) -> dict[str, torch.Tensor] | None:
        """Window t−1's aggregate Δ, recomputed from the leader's public bundle (what the replayer uploads)."""
        got = self.follower.bundle(t - 1, time.time())
        if not isinstance(got, Bundle):
            return None
        used = [u for u in got.uids if u in got.payloads]
        return dict(aggregate(self.ctx.codec, [got.payloads[u].update for u in used], self.ctx.hp, used).delta)

    def sybil_update(self, t: int, update: CompressedUpdate | None, sync: torch.Tensor,
                     until: float) -> CompressedUpdate | None:
        """All sybils of a group upload the update the lowest uid of the group trained."""
        ctx = self.ctx
        mine = encode_payload(ctx.codec, update, sync, self.meta(t)) if update is not None else None
        shared = behaviours.sybil_exchange(self.sybil_dir, ctx.uid, t, mine, until - time.time() - 0.5)
        if shared is None:
            return None
        payload = decode_payload(shared, ctx.codec, Expect.from_hparams(ctx.hp, t))
        return None if isinstance(payload, Rejection) else payload.update


def main(argv: list[str] | None = None) -> int:
    parser: argparse.ArgumentParser = build_parser(__doc__ or "")
    parser.add_argument("--behaviour", required=True, help=f"one of {', '.join(behaviours.BEHAVIOURS)}")
    cfg, ns = parse_args(argv, parser=parser)
    forger = start_forger(cfg, ns.behaviour)
    try:
        miner = AdversarialMiner(build_context(cfg, "miner"), ns.behaviour)
        if forger is not None:
            forger.forge = lambda true: behaviours.forged_time(true, miner.opened)
        return miner.run()
    finally:
        if forger is not None:
            forger.close()


def start_forger(cfg: Config, behaviour: str) -> ForgingS3 | None:
    """A forger writes to the real endpoint and publishes its own server in front of it, which serves every
    LastModified up to ``BACKDATE_BY`` seconds early (sim/forging_s3.py, behaviours.forged_time)."""
    if behaviour not in behaviours.FORGERS:
        return None
    forger = ForgingS3(cfg.storage.endpoint, shifted_by(-behaviours.BACKDATE_BY)).start()
    cfg.storage.public_endpoint = forger.endpoint
    log.info("%s: readers reach the bucket through %s, which forges LastModified up to %.1f s early",
             behaviour, forger.endpoint, behaviours.BACKDATE_BY)
    return forger


if __name__ == "__main__":
    run_main(main)
