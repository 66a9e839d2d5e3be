"""Behaviours that upload their own training: honest, diligent, changed on the way (scaled, negated, late, hidden),
out of step with the network (desync), shared by two uids (sybil) or trained only when evaluated (gamer)."""
from __future__ import annotations

import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import ClassVar

from dso.codec.codecs import Update
from sim.behaviours.base import (
    DESYNC_EVERY,
    DESYNC_LENGTH,
    GAMER_PERIOD,
    GAMER_THRESHOLD,
    HIDE_BY,
    SCALE,
    Behaviour,
    Foresight,
    Inputs,
    Plan,
)
from sim.behaviours.updates import scaled, zeros


class Honest(Behaviour):
    good = True


class Diligent(Behaviour):
    name, good = "diligent", True

    def plan(self, window: int, foresight: Foresight | None = None) -> Plan:
        return Plan(data_batches=2)


class Scaler(Behaviour):
    name = "scaler"
    factor: ClassVar[float] = SCALE

    def upload(self, inputs: Inputs) -> Update | None:
        return None if inputs.own is None else scaled(inputs.codec, inputs.window, inputs.own, self.factor)


class Signflip(Scaler):
    name, factor = "signflip", -1.0


class Late(Behaviour):
    name = "late"

    def plan(self, window: int, foresight: Foresight | None = None) -> Plan:
        return Plan(late=True)


class Hider(Behaviour):
    name, forges = "hider", True

    def plan(self, window: int, foresight: Foresight | None = None) -> Plan:
        return Plan(late=True, late_by=HIDE_BY)


class Desync(Behaviour):
    name = "desync"

    def plan(self, window: int, foresight: Foresight | None = None) -> Plan:
        return Plan(apply_aggregate=window % DESYNC_EVERY >= DESYNC_LENGTH)

    def follows(self, window: int, behind: Collection[int] | None = None) -> bool:
        return window not in behind if behind is not None else super().follows(window)


class Sybil(Behaviour):
    """Both uids of a pair upload the update one of them trained (the transport shares it: sybil_exchange)."""

    name, shares_update = "sybil", True


class Gamer(Behaviour):
    """Trains when it expects evaluation; uploads zeros otherwise (they pass SyncScore: it follows the network)."""

    name = "gamer"

    def plan(self, window: int, foresight: Foresight | None = None) -> Plan:
        """With foresight (the simulator), from its chance of being evaluated; without it (the local network), one
        window in ``GAMER_PERIOD``."""
        if foresight is not None:
            return gamer_plan(foresight())
        return gamer_plan(1.0 if window % GAMER_PERIOD == 0 else 0.0)

    def upload(self, inputs: Inputs) -> Update | None:
        return zeros(inputs.codec, inputs.window) if inputs.own is None else inputs.own


def gamer_plan(evaluation_chance: float, threshold: float = GAMER_THRESHOLD) -> Plan:
    """The gamer trains only when it expects evaluation; it still follows the network (its zeros must pass
    SyncScore)."""
    return Plan(train=evaluation_chance >= threshold)


def sybil_exchange(group_dir: Path, uid: int, window: int, update_bytes: bytes | None, timeout: float,
                   clock: Callable[[], float] = time.time) -> bytes | None:
    """Sybils share one update through a directory: the lowest uid of the group trains and writes it, the
    others wait for it (until ``timeout`` seconds from now) and upload those bytes under their own uid."""
    group_dir.mkdir(parents=True, exist_ok=True)
    (group_dir / f"member-{uid}").touch()
    leader = min(int(p.name.split("-")[1]) for p in group_dir.glob("member-*"))
    shared = group_dir / f"window-{window}.bin"
    if uid == leader:
        if update_bytes is not None:
            tmp = shared.with_suffix(".tmp")
            tmp.write_bytes(update_bytes)
            tmp.replace(shared)
        return update_bytes
    deadline = clock() + timeout
    while not shared.exists():
        if clock() > deadline:
            return None
        time.sleep(0.05)
    return shared.read_bytes()
