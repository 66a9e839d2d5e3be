"""The upload half of a miner (neurons/miner.py): its payload for a window — the update, sync samples of θ_t and
the header — where it goes (signed, or committed then revealed) and the time the next training deadline leaves
for it; and the cleanup of its bucket."""
from __future__ import annotations

import logging
import time

import torch

from dso.codec.demo import CompressedUpdate
from dso.nn.model import sync_sample_count
from dso.protocol.clock import PutWindow
from dso.protocol.payload import PayloadMeta
from dso.training.inner import InnerReport
from neurons import reveal
from neurons.context import NodeContext
from neurons.publish import publish_payload
from neurons.theta import Theta
from scoring.sync import sync_positions
from storage.cleanup import cleanup
from storage.client import StorageError
from storage.look import SIGNATURE_LEAD_SECONDS, signature_lead
from storage.wire import encode_payload

log = logging.getLogger("dso.miner")
UPLOAD_MARGIN = 0.5     # an upload started later than this before the put window closes would land late
# first guess of error feedback + payload + signature + upload time (the payload goes up SIGNATURE_LEAD_SECONDS
# after its signature), until one is measured
ENCODE_SECONDS = 1.0 + SIGNATURE_LEAD_SECONDS
ENCODE_MARGIN = 0.5     # added to the measured time: a miner's CPU share varies from one window to the next


class MinerUploads:
    """What :class:`neurons.miner.Miner` uploads and how; the miner sets these attributes."""

    ctx: NodeContext
    report: InnerReport       # the window's inner training (the payload declares its sequences)
    encode_seconds: float     # what the training deadline leaves before the put window closes
    margin_from: float        # when the last training ended, or its deadline if earlier

    @property
    def theta(self) -> Theta:
        """The node's θ_t, which the payload samples and hashes: one process's model (a miner on ranks: every
        rank's slice, neurons/miner_ranks.py)."""
        return self.ctx.theta

    def upload(self, t: int, own: CompressedUpdate | None, put: PutWindow) -> bool:
        """Put window t's payload in our bucket (with commit-reveal: commit now, reveal after the put window)."""
        if own is None:
            return False
        lead = self.signature_lead()  # the payload follows its signature
        if time.time() >= put.close - UPLOAD_MARGIN - lead:
            log.warning("window %d: training ended after the put window; not uploading", t)
            self.keep_for_upload(lead)  # leave more next time: the last step or the compression took longer
            return False
        data = self.payload(t, own)
        if data is None:
            return False
        if self.ctx.hp.commit_reveal:
            return reveal.upload(self.ctx, t, data, put)
        return self.put_payload(t, data)

    def keep_for_upload(self, still_to_come: float = 0.0) -> None:
        """What the next training deadline leaves before the put window closes: the time from this window's
        deadline (or the end of training, if earlier) to now — an overrun of the last step, compression,
        encoding, the signature's lead and the upload (``still_to_come``: the part an upload refused now would
        still have taken) — plus a margin for a CPU share that varies; at most the put window and the lead."""
        cap = self.ctx.hp.put_window_seconds + self.signature_lead()
        self.encode_seconds = min(ENCODE_MARGIN + time.time() - self.margin_from + still_to_come, cap)

    def signature_lead(self) -> float:
        """How long our payload follows its signature (neurons/publish.py; under commit-reveal, none)."""
        return 0.0 if self.ctx.hp.commit_reveal else signature_lead(self.ctx.hp.put_window_seconds)

    def payload(self, t: int, update: CompressedUpdate) -> bytes | None:
        """The bytes we upload for window t: our update and sync samples of θ_t (None: no randomness yet)."""
        sync = self.sync_samples(t)
        return None if sync is None else encode_payload(self.ctx.codec, update, sync, self.meta(t))

    def sync_samples(self, t: int) -> torch.Tensor | None:
        """θ_t at the positions window t's chain randomness picks (for the validator's SyncScore)."""
        ctx = self.ctx
        randomness = ctx.wait_randomness(t)
        if randomness is None:
            log.warning("window %d: no chain randomness for the sync samples; not uploading", t)
            return None
        positions = sync_positions(randomness, ctx.shapes, sync_sample_count(ctx.hp))
        return self.theta.sample(positions)

    def put_payload(self, t: int, data: bytes) -> bool:
        """Signed: the signature first, the payload a lead later from a thread (neurons/publish.py)."""
        return publish_payload(self.ctx, t, data, wait=False)

    def clean_bucket(self, t: int) -> None:
        """Delete our objects older than the retention, and every object an earlier run left in the bucket."""
        ctx = self.ctx
        try:
            cleanup(ctx.own.client, ctx.own.bucket, t, ctx.cfg.storage.retention_windows, ctx.run)
        except StorageError as e:
            log.warning("window %d: cleanup failed: %s", t, e)

    def meta(self, t: int) -> PayloadMeta:
        """The payload's header: with the sequences of its assignment this window's update was trained on."""
        ctx = self.ctx
        return PayloadMeta(ctx.uid, t, ctx.hp.protocol_version, ctx.hp.digest(), ctx.dataset.data_hash,
                           self.theta.hash(), trained=self.report.sequences)
