"""How the leader of a node's ranks tells the others what to do next.

A node started by torchrun runs its ordinary loop on rank 0 (the leader: chain, S3, clock, decisions);
every other rank waits for orders and carries them out with the leader, collective by collective.  An
order is a small JSON message ``{"to": part, "op": name, "args": {...}}`` broadcast by the leader; the
tensors an order needs travel in the collectives that follow it.  Parts are the objects both sides hold
(the inner loop, the error feedback, the evaluator …), each with a ``handle(op, args)`` method.

A rank other than the leader ignores SIGINT and SIGTERM: it stops when the leader says so (after the
leader has finished its step and saved), or when the group breaks (the leader died: torchrun ends the rest).
"""
from __future__ import annotations

import logging
import signal
from typing import Any, Mapping, Protocol

from dso.distributed import Ranks, broadcast_json

log = logging.getLogger("dso.ranks")
STOP = "stop"


class Part(Protocol):
    def handle(self, op: str, args: Mapping[str, Any]) -> None: ...


class Orders:
    """The leader's side: announce each collective operation before taking part in it."""

    def __init__(self, ranks: Ranks):
        self.ranks = ranks
        self.stopped = False

    def announcer(self, part: str) -> Any:
        """The ``announce(op, args)`` callback of one part."""
        def announce(op: str, args: dict[str, Any]) -> None:
            self.send(part, op, args)
        return announce

    def send(self, part: str, op: str, args: Mapping[str, Any] | None = None) -> None:
        if self.stopped:
            raise RuntimeError(f"order {part}.{op} after the ranks were stopped")
        broadcast_json(self.ranks, {"to": part, "op": op, "args": dict(args or {})})

    def stop(self) -> None:
        """Let the other ranks end (once)."""
        if not self.stopped:
            self.send("node", STOP)
            self.stopped = True


def receive(ranks: Ranks) -> tuple[str, str, dict[str, Any]]:
    """The leader's next order (on a rank other than the leader)."""
    msg = broadcast_json(ranks)
    return str(msg["to"]), str(msg["op"]), dict(msg["args"])


def follow_orders(ranks: Ranks, parts: Mapping[str, Part]) -> int:
    """Carry out the leader's orders until it says stop; the number of orders carried out."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # the leader decides when this rank stops
    done = 0
    while True:
        part, op, args = receive(ranks)
        if part == "node" and op == STOP:
            log.info("rank %d: stopped by the leader after %d orders", ranks.rank, done)
            return done
        if part not in parts:
            raise RuntimeError(f"rank {ranks.rank}: order for unknown part {part!r}")
        parts[part].handle(op, args)
        done += 1
