"""How a validator (neurons/validator.py) sees the miners' uploads of a window: it watches them arrive while the
put window is open, looks at every one once the uploads closed (and, under commit-reveal, at the commitments
before anyone reveals), then gathers the payloads — storage/look.py and storage/reveal.py do the reading."""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping

from dso.protocol.clock import GATHER_SETTLE_SECONDS, certain_after, commit_look_ends
from neurons.context import NodeContext
from scoring.state import ValidatorState
from storage import keys
from storage.commitment import BucketInfo
from storage.gather import GatherOptions, GatherResult
from storage.look import LOOK_SECONDS, Look, Seen, look, speakers_first, watch, watch_interval
from storage.reveal import CommitReveal, gather_window
from storage.wire import Expect

log = logging.getLogger("dso.validator")
MIN_COMMIT_LOOK_SECONDS = 0.2  # commit-reveal: a look at the commitments with less time left than this is skipped


class ValidatorUploads:
    """The validator's looks at the uploads; :class:`neurons.validator.Validator` sets these attributes."""

    ctx: NodeContext
    scores: ValidatorState        # whose uploads are read first (standing)
    silent: set[int]              # peers that gave the last watch no answer: asked last
    look: Look | None             # what the last look at the close of the uploads saw
    commitments_look: Look | None  # commit-reveal: the look at the commitments, before the reveals
    gather_seconds: dict[int, float]  # uid → seconds the last gather spent on it (for the metrics)

    def watch_uploads(self, t: int, close: float) -> dict[int, Seen]:
        """While window t's uploads are open, when the validator first saw each (storage/look.py ``watch``): the
        copy tie-break's order.  Nothing when the validator is busy past the close."""
        ctx = self.ctx
        if not ctx.clock.sleep_until(close - ctx.clock.put_window_seconds, ctx.stop) or time.time() >= close:
            return {}
        return watch(t, self.commitments_of(ctx.peers.miners()), Expect.from_hparams(ctx.hp, t, run=ctx.run), close,
                     readers=ctx.readers, stop=ctx.stop, priority=self.scores.standing(), silent=self.silent,
                     interval=watch_interval(ctx.hp.put_window_seconds))

    def look_at_close(self, t: int, close: float, first: dict[int, Seen] | None = None) -> Look | None:
        """Look at every miner's upload once the uploads of window t closed (the put window; the reveal window
        under commit-reveal): an upload certainly absent then is late whatever LastModified its server reports
        (storage/look.py, docs/scoring.md).  None (LastModified alone) when replaying a window long closed."""
        ctx = self.ctx
        if time.time() > certain_after(close) + ctx.clock.put_window_seconds:
            return None
        peers = self.commitments_of(ctx.peers.miners())
        # ends by a second past the usual gather start (a stalling server cannot delay the window more than that)
        budget = max(0.5, min(LOOK_SECONDS, close + GATHER_SETTLE_SECONDS + 1.0 - time.time()))
        found = look(t, peers, Expect.from_hparams(ctx.hp, t, run=ctx.run), close, budget=budget, readers=ctx.readers,
                     priority=speakers_first(peers, self.scores.standing(), self.silent))
        found.first = dict(first or {})
        self.silent = (self.silent | found.silent) - set(found.seen) - set(found.absent)
        log.info("window %d: looked at the uploads %.2f s after they closed: %s", t, found.started - close,
                 found.summary())
        return found

    def look_at_commitments(self, t: int) -> Look | None:
        """Commit-reveal: look at every miner's commitment for window t after the put window closed and before
        anyone reveals (dso.protocol.clock.reveal_time), so a commitment made late — or made after reading the reveals —
        is caught whatever LastModified its server forges.  None (LastModified alone) when we are too late."""
        ctx = self.ctx
        put = ctx.clock.put_window(t)
        if time.time() > commit_look_ends(put) - MIN_COMMIT_LOOK_SECONDS or not ctx.clock.sleep_until(
                certain_after(put.close), ctx.stop):
            return None
        expect = Expect.from_hparams(ctx.hp, t, run=ctx.run)
        found = look(t, self.commitments_of(ctx.peers.miners()), expect, put.close,
                     budget=max(0.0, commit_look_ends(put) - time.time()), readers=ctx.readers,
                     key_for=lambda uid: keys.commit(t, uid, expect.protocol_version, expect.run),
                     priority=speakers_first(ctx.peers.miners(), self.scores.standing(), self.silent))
        log.info("window %d: looked at the commitments %.2f s after the put window closed: %s", t,
                 found.started - put.close, found.summary())
        return found

    def commitments_of(self, uids: Iterable[int]) -> dict[int, BucketInfo | str | None]:
        """uid → its commitment on chain (None without one), for ``uids``."""
        commitments = self.ctx.peers.commitments()
        return {u: commitments.get(u) for u in uids}

    def gather(self, t: int, peers: Mapping[int, str]) -> GatherResult:
        """Window t's payloads of ``peers`` (uid → hotkey, whose signature each must carry), under the run's upload
        rules (plain or commit-reveal)."""
        ctx = self.ctx
        options = GatherOptions(readers=ctx.readers, priority=self.scores.standing(), hotkeys=peers,
                                judge=self.look.judge if self.look is not None else None)
        result = gather_window(t, self.commitments_of(sorted(peers)), ctx.codec,
                               Expect.from_hparams(ctx.hp, t, run=ctx.run, data_hash=ctx.dataset.data_hash),
                               ctx.clock.put_window(t), ctx.cfg.storage.gather_deadline_seconds, options,
                               CommitReveal(self.commitments_look) if ctx.hp.commit_reveal else None)
        self.gather_seconds = result.peer_seconds
        return result
