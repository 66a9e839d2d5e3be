"""How a miner follows the network each window: the leader's top-G list, gathering, the signed step.

The aggregation set of window t is the leading validator's list for t
intersected with the payloads that pass the strict checks (format and put
window; with commit-reveal also a timely commitment that the revealed payload
matches) — inputs every node sees identically, so honest nodes compute the same
θ_{t+1} bits as the validator.  The validator's ledger record of window t
(``new_model_hash``) is checked later; a node that diverged catches up.
"""
from __future__ import annotations

import logging
import time

from dso.aggregation import aggregate_signs, signed_step
from dso.clock import PutWindow
from dso.model import model_hash
from dso.rejections import Rejection
from dso.train import learning_rate
from neurons.context import NodeContext
from storage import keys
from storage.gather import GatherResult
from storage.jsonobj import get_json
from storage.peers import get_peers
from storage.reveal import gather_window
from storage.wire import Expect

log = logging.getLogger("dso.follow")
LIST_WAIT_SECONDS = 3.0   # how long past the last upload of a window a node waits for the leader's list


class Follower:
    """Applies each window's aggregate to the node's model (``ctx.model``) and checks it against the ledger."""

    def __init__(self, ctx: NodeContext):
        self.ctx = ctx
        self.last_list: list[int] = []
        self.pending_checks: dict[int, str] = {}  # window → our model hash after applying it
        self.diverged = False                     # a ledger record disagreed with our model
        self.bytes = 0
        self.gather_seconds: dict[int, float] = {}  # uid → seconds gathering it (for the metrics)

    def take_bytes(self) -> int:
        n, self.bytes = self.bytes, 0
        return n

    def take_gather_seconds(self) -> dict[str, float]:
        """uid → seconds the gathers since the last call spent on that peer (for the window's record)."""
        out, self.gather_seconds = {str(u): round(s, 4) for u, s in self.gather_seconds.items()}, {}
        return out

    def peers_list(self, t: int, until: float) -> tuple[list[int], str]:
        """The leader's top-G list for window t (waiting until ``until``), else the last one known."""
        while True:
            source = self.ctx.peers.leader()
            if source is not None and not isinstance(source, Rejection):
                got = get_peers(*source, t, self.ctx.hp.protocol_version)
                if not isinstance(got, Rejection):
                    self.last_list = list(got.uids)
                    return self.last_list, "leader"
            if time.time() >= until or not self.ctx.stop.sleep(0.25):
                return self.last_list, "previous list (the leader's was not published in time)"

    def gather(self, t: int, uids: list[int], put: PutWindow, deadline: float) -> GatherResult:
        """Window t's updates of ``uids``, checked exactly as the validator checks them."""
        ctx = self.ctx
        commitments = ctx.peers.commitments()
        result = gather_window(t, {u: commitments.get(u) for u in uids}, ctx.codec, Expect.from_hparams(ctx.hp, t),
                               put, deadline, commit_reveal=ctx.hp.commit_reveal, readers=ctx.readers,
                               peer_seconds=self.gather_seconds)
        self.bytes += result.bytes_down
        return result

    def aggregate(self, t: int) -> str:
        """Apply window t's aggregate to the model; returns a short summary for the log."""
        ctx = self.ctx
        put = ctx.clock.put_window(t)
        uids, source = self.peers_list(t, ctx.clock.uploads_close(t, ctx.hp.commit_reveal) + LIST_WAIT_SECONDS)
        result = self.gather(t, uids, put, ctx.cfg.storage.gather_deadline_seconds)
        used = sorted(result.payloads)
        signs, _ = aggregate_signs(ctx.codec, [result.payloads[u].update for u in used], ctx.hp, used, ctx.device)
        signed_step(ctx.model, signs, learning_rate(ctx.hp, t), ctx.hp.weight_decay)
        self.pending_checks[t] = model_hash(ctx.model)
        self.verify_ledger()
        return f"aggregated {len(used)}/{len(uids)} peers ({source})"

    def verify_ledger(self) -> None:
        """Compare our θ after each applied window with the validator's record once it is published;
        a mismatch sets :attr:`diverged` (the caller then catches up from checkpoint + aggregates)."""
        source = self.ctx.peers.leader()
        if source is None or isinstance(source, Rejection):
            return
        for window in sorted(self.pending_checks):
            record = get_json(*source, keys.ledger(window, self.ctx.hp.protocol_version))
            if isinstance(record, Rejection):
                if window < max(self.pending_checks) - 3:
                    del self.pending_checks[window]  # the validator skipped it; stop asking
                continue
            ours = self.pending_checks.pop(window)
            if record.get("new_model_hash") != ours:
                log.warning("window %d: our model differs from the validator's; catching up", window)
                self.diverged = True
