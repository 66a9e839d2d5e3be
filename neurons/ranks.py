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

import dataclasses
import logging
import os
import signal
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch

from dso.config.schema import Config, HParams
from dso.config.sources import from_dict
from dso.distributed.ranks import Ranks, broadcast_json, join_group, leave_group, return_freed_tensors
from dso.util.processes import autogroup_nice, die_with_parent

log = logging.getLogger("dso.ranks")
STOP, HELLO = "stop", "hello"


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

    def hello(self, hp: HParams) -> None:
        """The first order: the run's hyper-parameters, from which the other ranks build their parts."""
        self.send("node", HELLO, {"hparams": dataclasses.asdict(hp)})

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


def follow_leader(cfg: Config, ranks: Ranks,
                  follower_parts: Callable[[Config, Ranks, HParams], Mapping[str, Part]]) -> int:
    """A rank other than the leader: wait for its hello, build the parts from its hyper-parameters, carry out
    its orders until it stops; the number of orders carried out."""
    torch.set_num_threads(cfg.threads)
    part, op, args = receive(ranks)
    if (part, op) == ("node", STOP):  # the leader stopped before it started (e.g. no local network)
        return 0
    if (part, op) != ("node", HELLO):
        raise RuntimeError(f"rank {ranks.rank}: expected the leader's hello, got {part}.{op}")
    return follow_orders(ranks, follower_parts(cfg, ranks, from_dict({"hparams": args["hparams"]}).hparams))


def run_group(cfg: Config, lead: Callable[[Ranks, Orders], int],
              follower_parts: Callable[[Config, Ranks, HParams], Mapping[str, Part]]) -> int:
    """This process's part of a torchrun node: ``lead`` on rank 0 (which must say hello first), and elsewhere
    the parts ``follower_parts`` builds from the leader's hyper-parameters, carrying out its orders."""
    ranks = join_group(cfg.device)
    return_freed_tensors()  # a rank's memory is what limits the model it can hold (dso/distributed/ranks.py)
    # torchrun starts each rank in a session of its own: the rank keeps the niceness the node was started with
    # (its own scheduling group otherwise gets a full share), and ends when the torchrun process does
    autogroup_nice(os.nice(0))
    die_with_parent(os.getppid(), signal.SIGTERM if ranks.leader else signal.SIGKILL)
    try:
        if not ranks.leader:
            follow_leader(cfg, ranks, follower_parts)
            return 0
        orders = Orders(ranks)
        try:
            return lead(ranks, orders)
        finally:
            orders.stop()
    finally:
        leave_group()
