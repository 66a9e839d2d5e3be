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
from storage import keys
from storage.gather import gather
from storage.jsonobj import get_json
from storage.peers import get_peers
from storage.reveal import gather_window
from storage.wire import Expect

log = logging.getLogger("dso.follow")
LIST_WAIT_SECONDS = 3.0   # how long past the last upload of a window a node waits for the leader's list


class Follower:
    def __init__(self, node, model):
        self.node, self.model = node, model
        self.last_list: list[int] = []
        self.pending_checks: dict[int, str] = {}  # window → our model hash after applying it
        self.diverged = False                     # a ledger record disagreed with our model
        self.bytes = 0

    def take_bytes(self) -> int:
        n, self.bytes = self.bytes, 0
        return n

    def peers_list(self, t: int, until: float) -> tuple[list[int], str]:
        """The leader's top-G list for window t (waiting until ``until``), else the last one known."""
        while True:
            source = self.node.leader()
            if source is not None and not isinstance(source, Rejection):
                got = get_peers(*source, t, self.node.hp.protocol_version)
                if not isinstance(got, Rejection):
                    self.last_list = list(got.uids)
                    return self.last_list, "leader"
            if time.time() >= until or not self.node.stop.sleep(0.25):
                return self.last_list, "previous list (the leader's was not published in time)"

    def gather(self, t: int, uids: list[int], put: PutWindow, deadline: float):
        """Window t's updates of ``uids``, checked exactly as the validator checks them."""
        node = self.node
        buckets = node.buckets()
        node.codec.set_window(t)
        result = gather_window(t, {u: buckets.get(u) for u in uids}, node.codec, Expect.from_hparams(node.hp, t),
                               put, deadline, commit_reveal=node.hp.commit_reveal, readers=node.readers)
        self.bytes += result.bytes_down
        return result

    def aggregate(self, t: int) -> str:
        """Apply window t's aggregate to the model; returns a short summary for the log."""
        node = self.node
        put = node.clock.put_window(t)
        uids, source = self.peers_list(t, node.clock.uploads_close(t, node.hp.commit_reveal) + LIST_WAIT_SECONDS)
        result = self.gather(t, uids, put, node.cfg.storage.gather_deadline_seconds)
        used = sorted(result.payloads)
        signs, _ = aggregate_signs(node.codec, [result.payloads[u].update for u in used], node.hp, used,
                                   node.device)
        signed_step(self.model, signs, learning_rate(node.hp, t), node.hp.weight_decay)
        self.pending_checks[t] = model_hash(self.model)
        self.verify_ledger()
        return f"aggregated {len(used)}/{len(uids)} peers ({source})"

    def verify_ledger(self) -> None:
        """Compare our θ after each applied window with the validator's record once it is published;
        a mismatch sets :attr:`diverged` (the caller then catches up from checkpoint + aggregates)."""
        source = self.node.leader()
        if source is None or isinstance(source, Rejection):
            return
        for window in sorted(self.pending_checks):
            record = get_json(*source, keys.ledger(window, self.node.hp.protocol_version))
            if isinstance(record, Rejection):
                if window < max(self.pending_checks) - 3:
                    del self.pending_checks[window]  # the validator skipped it; stop asking
                continue
            ours = self.pending_checks.pop(window)
            if record.get("new_model_hash") != ours:
                log.warning("window %d: our model differs from the validator's; catching up", window)
                self.diverged = True

    def read_payloads(self, t: int, start: float, until: float, wanted: bool, behaviour: str) -> list:
        """Other miners' payloads of window t as readable between ``start`` and ``until`` (copier, alie, ipm:
        during the put window; with commit-reveal nothing is readable then, so during the reveal window)."""
        if not wanted:
            return []
        node = self.node
        node.clock.sleep_until(start, node.stop)
        validators = {n.uid for n in node.chain.metagraph() if n.validator_permit}
        others = {u: c for u, c in node.buckets().items() if u != node.uid and u not in validators}
        node.codec.set_window(t)
        result = gather(t, others, node.codec, Expect.from_hparams(node.hp, t), None,
                        max(0.5, until - time.time() - 0.5), readers=node.readers)
        self.bytes += result.bytes_down
        payloads = [result.payloads[u] for u in sorted(result.payloads)]
        log.info("window %d: %s read %d updates of others", t, behaviour, len(payloads))
        return payloads
