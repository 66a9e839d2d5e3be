"""How a node follows the network each window: the leading validator's bundle of the window, applied.

The bundle (storage/aggregate.py) holds exactly the payloads the leader
aggregated, identified by content hash; applying it is the validator's own
aggregation step (neurons/engine.py), checked against the model hashes the
leader recorded.  Every honest node therefore holds the same θ_{t+1}, whatever
a peer does to its own objects after the put window.
"""
from __future__ import annotations

import logging
import time

from dso.rejections import Reason, Rejection
from neurons.catchup import apply_bundle
from neurons.context import NodeContext
from storage.aggregate import Bundle, get_bundle

log = logging.getLogger("dso.follow")
POLL_SECONDS = 0.3


class Follower:
    def __init__(self, ctx: NodeContext):
        self.ctx = ctx
        self.diverged = False   # the last bundle did not reproduce the leader's model: reload from a checkpoint
        self.bytes = 0
        self.next_look = 0.0    # time.monotonic() before which arrived() does not look again

    def take_bytes(self) -> int:
        n, self.bytes = self.bytes, 0
        return n

    def bundle(self, t: int, until: float) -> Bundle | Rejection:
        """The leader's bundle of window t, waiting for it until ``until`` (unix time)."""
        while True:
            source = self.ctx.peers.leader(t)
            got: Bundle | Rejection = Rejection(Reason.MISSING, "no leading validator")
            if source is not None and not isinstance(source, Rejection) and self.ctx.run:
                got = get_bundle(*source, self.ctx.codec, self.ctx.hp, t, self.ctx.run)
                if isinstance(got, Bundle):
                    self.bytes += got.nbytes
                    return got
                if got.reason != Reason.MISSING:  # there, but unusable: waiting will not help
                    return got
            if time.time() >= until or not self.ctx.stop.sleep(POLL_SECONDS):
                return got

    def arrived(self, t: int) -> Bundle | Rejection | None:
        """One look for the leader's bundle of window t, without waiting: None while it is not published.
        Looks at most every POLL_SECONDS (a miner asks between inner steps, which can be milliseconds apart)."""
        if time.monotonic() < self.next_look:
            return None
        self.next_look = time.monotonic() + POLL_SECONDS
        got = self.bundle(t, 0.0)
        return None if isinstance(got, Rejection) and got.reason == Reason.MISSING else got

    def aggregate(self, t: int, until: float) -> tuple[bool, str]:
        """Apply window t's bundle to the model: (applied, a summary for the log)."""
        return self.apply(t, self.bundle(t, until))

    def apply(self, t: int, got: Bundle | Rejection) -> tuple[bool, str]:
        """Apply a bundle of window t (θ_t → θ_{t+1}) to the model: (applied, a summary for the log)."""
        if isinstance(got, Rejection):
            return False, f"no bundle of window {t} yet ({got.reason.value})"
        bad = apply_bundle(self.ctx.model, self.ctx.codec, self.ctx.hp, got, self.ctx.outer, self.ctx.device)
        if bad is not None:
            log.warning("window %d: %s; catching up from a checkpoint", t, bad.detail)
            self.diverged = True
            return False, f"diverged at window {t}"
        return True, f"applied the leader's bundle of {len(got.uids)} peers"
