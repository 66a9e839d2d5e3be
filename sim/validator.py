"""A lying leader for the local network: the honest validator, but its bundles lie once it has led a while.

    python -m sim.validator --behaviour lying_leader [--lie-after N] [every neurons/validator.py flag]

From its ``N``-th window on, whenever it leads, :class:`LyingLeader` changes what it aggregates — and so what its
bundle says — in three ways at once, in every window where it can do all three (sim/behaviours/
``LYING_LEADER``):

* it **forges** a payload: the second peer of its list keeps its uid and signature, with its update negated;
* it **includes a rejected** one: a payload its own gather rejected (too late, missing at the gather) read again
  afterwards, when it is there, and added to the list;
* it **drops the best** one: the first peer of its list.

It applies its own lie, so its model and hashes stay consistent, and each window's record says what it did
(``lie``).  Nothing in the core knows about it (the core never imports ``sim``).
"""
from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Mapping
from typing import Any

from dso.config.sources import build_parser, parse_args
from dso.protocol.payload import Payload
from dso.protocol.rejections import Reason
from neurons.context import NodeContext, build_context
from neurons.lifecycle import Fatal, run_main
from neurons.validator import Validator
from sim import behaviours
from storage import keys
from storage.commitment import BucketInfo, parse_commitment
from storage.gather import GatherResult, fetch_payload
from storage.wire import Expect

log = logging.getLogger("dso.sim.validator")
REREAD_SECONDS = 2.0  # how long the liar keeps reading a rejected payload again after its gather


class LyingLeader(Validator):
    def __init__(self, ctx: NodeContext, lie_after: int = 0):
        super().__init__(ctx)
        self.lie_after, self.processed = lie_after, 0
        self.lies: dict[int, dict[str, Any]] = {}
        emit = ctx.events.emit

        def emit_with_the_lie(record: dict[str, Any]) -> None:
            window = record.get("window")
            emit({**record, "lie": self.lies.pop(window, None)} if isinstance(window, int) else record)
        ctx.events.emit = emit_with_the_lie  # type: ignore[method-assign]

    def process(self, t: int) -> dict[str, Any]:
        line = super().process(t)
        self.processed += 1
        return line

    def gather(self, t: int, peers: Mapping[int, str]) -> GatherResult:
        got = super().gather(t, peers)
        if self.processed >= self.lie_after and self.leading(t):
            lie = self.lie(t, got, peers)
            if lie is not None:
                self.lies[t] = lie
                log.warning("window %d: lying: %s", t, lie)
        return got

    def lie(self, t: int, got: GatherResult, peers: Mapping[int, str]) -> dict[str, Any] | None:
        """Change window t's aggregation set in place (the payloads and our list): what the bundle will say.  All
        three lies or none: a list with two payloads we accepted, and a rejected payload to read again."""
        listed = list(self.book.lists.get(t, []))
        accepted = [u for u in listed if u in got.payloads]
        if len(accepted) < 2:
            return None
        included = self.reread_rejected(t, got, peers)
        if included is None:
            return None
        del got.payloads[accepted[0]]  # drop the best
        got.payloads[accepted[1]] = behaviours.forged_payload(self.ctx.codec, got.payloads[accepted[1]])
        self.book.lists[t] = listed + [included] if included not in listed else listed
        return {"dropped": accepted[0], "forged": accepted[1], "included_rejected": included}

    def reread_rejected(self, t: int, got: GatherResult, peers: Mapping[int, str]) -> int | None:
        """A payload our gather rejected as late or missing, read again (no time check) once it is there."""
        ctx = self.ctx
        candidates = [u for u, r in got.rejections.items() if r.reason in (Reason.TOO_LATE, Reason.MISSING)]
        commitments = ctx.peers.commitments()
        expect = Expect.from_hparams(ctx.hp, t, run=ctx.run, data_hash=ctx.dataset.data_hash)
        until = time.time() + REREAD_SECONDS
        while candidates and time.time() < until:
            for uid in candidates:
                info = parse_commitment(commitments.get(uid))
                if not isinstance(info, BucketInfo):
                    continue
                key = keys.gradient(t, uid, ctx.hp.protocol_version, ctx.run)
                outcome, _ = fetch_payload(ctx.readers.get(info), info.bucket, key, ctx.codec,
                                           expect.for_peer(uid, peers), None, time.monotonic() + 2.0)
                if isinstance(outcome, Payload):
                    got.payloads[uid] = outcome
                    del got.rejections[uid]
                    return uid
            ctx.stop.sleep(0.2)
        return None


def main(argv: list[str] | None = None) -> int:
    parser: argparse.ArgumentParser = build_parser(__doc__ or "")
    parser.add_argument("--behaviour", required=True, help=f"one of {', '.join(behaviours.VALIDATOR_BEHAVIOURS)}")
    parser.add_argument("--lie-after", type=int, default=0, help="windows it scores honestly first")
    cfg, ns = parse_args(argv, parser=parser)
    if ns.behaviour not in behaviours.VALIDATOR_BEHAVIOURS:
        raise Fatal(f"--behaviour {ns.behaviour!r}: choose from {', '.join(behaviours.VALIDATOR_BEHAVIOURS)}")
    return LyingLeader(build_context(cfg, "validator"), ns.lie_after).run()


if __name__ == "__main__":
    run_main(main)
