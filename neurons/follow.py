"""How a node follows the network each window: a validator's bundle of the window, checked and applied.

The bundle (storage/aggregate.py) holds exactly the payloads a validator aggregated, each as its miner signed
it; applying it is the validator's own aggregation step (neurons/engine.py), checked against the model hashes
the validator recorded.  Every honest node therefore holds the same θ_{t+1}, whatever a peer does to its own
objects after the put window.

Nobody has to trust the leader (docs/protocol.md, "A leader nobody has to trust"):

* a bundle is applied only if every payload in it carries its miner's valid signature for the window; a
  validator whose bundle does not is not followed again (one log line) and the node takes the bundle of the
  next validator by stake it still follows (:meth:`PeerDirectory.sources`) — one that refused the same bundle
  has aggregated its own selection;
* a node that finds no valid bundle in time after refusing one gathers the list's signed payloads itself and
  aggregates them (:meth:`Follower.gather_own`).
"""
from __future__ import annotations

import logging
import time

from dso.protocol.rejections import Reason, Rejection
from neurons import distrust
from neurons.catchup import apply_bundle
from neurons.context import NodeContext
from neurons.engine import aggregate_window
from storage.aggregate import Bundle, get_bundle, unsigned
from storage.gather import GatherOptions
from storage.peers import get_peers
from storage.reveal import CommitReveal, gather_window
from storage.wire import Expect

log = logging.getLogger("dso.follow")
POLL_SECONDS = 0.3


class Follower:
    def __init__(self, ctx: NodeContext):
        self.ctx = ctx
        self.diverged = False   # the last bundle did not reproduce the leader's model: reload from a checkpoint
        self.bytes = 0
        self.next_look = 0.0    # time.monotonic() before which arrived() does not look again
        self.refused: dict[int, str] = {}  # window → why a validator's bundle of it was refused
        self.source: dict[int, int] = {}   # window → the validator whose bundle of it we took

    def take_bytes(self) -> int:
        n, self.bytes = self.bytes, 0
        return n

    def fetch(self, source: int, t: int) -> Bundle | Rejection:
        """Validator ``source``'s bundle of window t with every payload's signature checked; a bundle holding a
        payload its miner did not sign is refused, and its validator is not followed again."""
        where = self.ctx.peers.reader(source)
        if isinstance(where, Rejection):
            return where
        got = get_bundle(*where, self.ctx.codec, self.ctx.hp, t, self.ctx.run)
        if not isinstance(got, Bundle):
            return got
        self.bytes += got.nbytes
        forged = unsigned(got, self.ctx.peers.hotkeys(), self.ctx.run)
        if forged:
            why = next(iter(forged.values()))
            self.refuse(source, t, why.detail)
            return why
        return got

    def refuse(self, source: int, t: int, why: str) -> None:
        """Stop following validator ``source`` (it is skipped as a source from now on); says so in one line."""
        self.ctx.peers.distrusted.add(source)
        distrust.save(self.ctx.state_dir, self.ctx.peers.distrusted, self.ctx.peers.hotkeys())
        self.refused[t] = why
        log.warning("window %d: not following validator uid %d: %s", t, source, why)

    def bundle(self, t: int, until: float) -> Bundle | Rejection:
        """The bundle of window t from the first validator by stake we follow (the leader, unless refused),
        waiting for it until ``until`` (unix time)."""
        while True:
            got: Bundle | Rejection = Rejection(Reason.MISSING, "no validator to follow")
            if self.ctx.run:
                for source in self.ctx.peers.sources(t):
                    got = self.fetch(source, t)
                    if isinstance(got, Bundle):
                        self.source[t] = source
                        break
                    if got.reason not in (Reason.UNSIGNED, Reason.BAD_SIGNATURE):
                        break  # the one we follow has none yet: wait for it
            if isinstance(got, Bundle) or (got.reason != Reason.MISSING and t not in self.refused):
                return got  # there, or there but unusable: waiting will not help
            if time.time() >= until or not self.ctx.stop.sleep(POLL_SECONDS):
                return got

    def arrived(self, t: int) -> Bundle | Rejection | None:
        """One look for the bundle of window t, without waiting: None while it is not published.
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
        """Apply a bundle of window t (θ_t → θ_{t+1}) to the model: (applied, a summary for the log).  Without one,
        after refusing a validator's bundle of t, the node gathers and aggregates the window itself."""
        if isinstance(got, Rejection):
            if t in self.refused:
                return self.gather_own(t)
            return False, f"no bundle of window {t} yet ({got.reason.value})"
        bad = apply_bundle(self.ctx.theta, self.ctx.codec, self.ctx.hp, got, self.ctx.outer, self.ctx.device)
        if bad is not None:
            log.warning("window %d: %s; catching up from a checkpoint", t, bad.detail)
            self.diverged = True
            return False, f"diverged at window {t}"
        return True, f"applied the bundle of {len(got.uids)} peers from validator uid {self.source.pop(t, '?')}"

    def gather_own(self, t: int) -> tuple[bool, str]:
        """No valid bundle of window t: gather the signed payloads of the list in effect and aggregate them in list
        order, as the leader should have.  The list comes from the first validator we follow that published it."""
        ctx = self.ctx
        listing = None
        for source in ctx.peers.sources(t):
            where = ctx.peers.reader(source)
            got = where if isinstance(where, Rejection) else get_peers(*where, t, ctx.hp.protocol_version, ctx.run)
            if not isinstance(got, Rejection):
                listing = got
                break
        if listing is None:
            return False, f"no valid bundle of window {t} and no list to gather ({self.refused[t][:80]})"
        commitments = ctx.peers.commitments()
        result = gather_window(t, {u: commitments.get(u) for u in listing.uids}, ctx.codec,
                               Expect.from_hparams(ctx.hp, t, run=ctx.run, data_hash=ctx.dataset.data_hash),
                               ctx.clock.put_window(t), ctx.cfg.storage.gather_deadline_seconds,
                               GatherOptions(readers=ctx.readers, hotkeys=ctx.peers.hotkeys()),
                               CommitReveal() if ctx.hp.commit_reveal else None)
        self.bytes += result.bytes_down
        agg = aggregate_window(ctx.theta, ctx.codec, ctx.hp, t, result.payloads, listing.uids, ctx.outer, ctx.device)
        log.info("window %d: no valid bundle; gathered and aggregated %d signed payloads of the list (%s…)", t,
                 len(agg.used), agg.hash_after[:10])
        return True, f"gathered and aggregated {len(agg.used)} signed payloads itself (no valid bundle)"

