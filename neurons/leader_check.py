"""A validator that does not lead checks the leader's bundle against its own gather and list before following it.

For window t the validator has gathered every peer itself (with its own look at the close) and holds its own
top-G list, from its own scores.  The leader's bundle says which payloads the leader aggregated.  They are
compared payload by payload (:func:`compare`):

* ``forged``: a payload its miner did not sign (no signature, or one that does not verify against the uid's
  hotkey on chain for this window): nobody may apply it;
* ``included_rejected``: a payload the validator's own gather rejected for a reason that settles it (format,
  signature, timing — absent at the look, or at the gather after the close —, a changed object, a commit-reveal
  offence): no honest leader that gathered at the same time would have taken it;
* ``differs``: a payload signed by its miner, but other bytes than the ones the validator read (the miner
  served two versions: counted, not held against the leader);
* ``unverified``: a payload the validator has no verdict on (its fetch timed out or the peer was unreachable);
* ``dropped``: a payload in the validator's own selection (its list for t, with a payload it accepted) that the
  bundle leaves out;
* ``unselected``: a payload with the bytes the validator accepted that its own scores left out of its selection
  (where the two validators' scores disagree: counted, not held against the leader).

A bundle with a forged or an included-rejected payload is not followed: one log line says so, the validator
stops following that leader (:attr:`PeerDirectory.distrusted`), and it takes the next validator's bundle by
stake, or aggregates its own selection when it is next.  Every count is in the window's record, which the node's
metrics export (``dso_leader_disagreement_payloads{kind}``, docs/operations.md).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dso.protocol.payload import Payload
from dso.protocol.rejections import Reason, Rejection
from neurons.context import NodeContext
from neurons.follow import POLL_SECONDS, Follower
from neurons.metrics import LEADER_KINDS
from storage.aggregate import Bundle, get_bundle, unsigned

log = logging.getLogger("dso.validator")
UNDECIDED = (Reason.TIMEOUT, Reason.UNREACHABLE)  # rejections that say nothing about the payload itself
KINDS = LEADER_KINDS


@dataclass
class Disagreement:
    """How one validator's bundle of a window differs from this validator's own gather and list."""

    window: int
    source: int                                  # the validator whose bundle it is
    forged: dict[int, str] = field(default_factory=dict)             # uid → why its signature fails
    included_rejected: dict[int, str] = field(default_factory=dict)  # uid → our rejection's reason
    differs: list[int] = field(default_factory=list)
    unverified: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    unselected: list[int] = field(default_factory=list)

    @property
    def refuse(self) -> bool:
        return bool(self.forged or self.included_rejected)

    def counts(self) -> dict[str, int]:
        return {kind: len(getattr(self, kind)) for kind in KINDS}

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "refused": self.refuse, **self.counts(),
                "uids": {kind: sorted(getattr(self, kind)) for kind in KINDS if getattr(self, kind)}}

    def line(self) -> str:
        parts = [f"uid {u} not signed by its miner ({why[:60]})" for u, why in sorted(self.forged.items())]
        parts += [f"uid {u} that we rejected ({reason})" for u, reason in sorted(self.included_rejected.items())]
        return f"its bundle holds {'; '.join(parts)}"


def compare(bundle: Bundle, source: int, payloads: Mapping[int, Payload], rejections: Mapping[int, Rejection],
            selection: Sequence[int], hotkeys: Mapping[int, str], run: str) -> Disagreement:
    """Validator ``source``'s ``bundle`` against our own gather (``payloads`` accepted, ``rejections``) and our
    ``selection`` (our list for the window ∩ our accepted payloads)."""
    out = Disagreement(bundle.window, source)
    out.forged = {uid: r.detail for uid, r in unsigned(bundle, hotkeys, run).items()}
    selected = set(selection)
    for uid in bundle.uids:
        if uid in out.forged:
            continue
        ours, rejected = payloads.get(uid), rejections.get(uid)
        if ours is not None:
            if ours.sha256 and ours.sha256 != bundle.payloads[uid].sha256:
                out.differs.append(uid)
            elif uid not in selected:
                out.unselected.append(uid)
        elif rejected is not None and rejected.reason not in UNDECIDED:
            out.included_rejected[uid] = rejected.reason.value
        else:
            out.unverified.append(uid)
    out.dropped = [uid for uid in selection if uid in payloads and uid not in bundle.uids]
    return out


def wait_bundle(ctx: NodeContext, source: int, t: int, until: float) -> Bundle | Rejection:
    """Validator ``source``'s bundle of window t, waiting for it to appear until ``until`` (unix time)."""
    while True:
        where = ctx.peers.reader(source)
        got = where if isinstance(where, Rejection) else get_bundle(*where, ctx.codec, ctx.hp, t, ctx.run)
        if isinstance(got, Bundle) or got.reason != Reason.MISSING:
            return got
        if time.time() >= until or not ctx.stop.sleep(POLL_SECONDS):
            return got


def choose_bundle(ctx: NodeContext, follower: Follower, t: int, payloads: Mapping[int, Payload],
                  rejections: Mapping[int, Rejection], selection: Sequence[int], until: float
                  ) -> tuple[Bundle | None, Disagreement | None]:
    """(the bundle to apply for window t, or None to aggregate our own selection; the comparison of the first
    bundle checked — the leader's, unless we refused it before).  Validators are tried by stake: a refused one is
    skipped from then on, and once we are next, our own selection is the one to apply."""
    hotkeys = ctx.peers.hotkeys()
    leader = ctx.peers.leader_uid(t)
    first: Disagreement | None = None
    if leader is not None and leader != ctx.uid and leader in ctx.peers.distrusted:
        # a leader we no longer follow is still compared, once its bundle is there: the metric keeps showing it
        where = ctx.peers.reader(leader)
        got = where if isinstance(where, Rejection) else get_bundle(*where, ctx.codec, ctx.hp, t, ctx.run)
        if isinstance(got, Bundle):
            first = compare(got, leader, payloads, rejections, selection, hotkeys, ctx.run)
    for source in ctx.peers.sources(t):
        if source == ctx.uid:
            return None, first
        got = wait_bundle(ctx, source, t, until)
        if isinstance(got, Rejection):
            log.warning("window %d: no bundle from validator uid %d (%s); aggregating our own list", t, source, got)
            return None, first
        check = compare(got, source, payloads, rejections, selection, hotkeys, ctx.run)
        first = first or check
        if not check.refuse:
            return got, first
        follower.refuse(source, t, check.line())
    return None, first
