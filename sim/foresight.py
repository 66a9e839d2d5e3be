"""How sure a miner can be, at upload time, that the validator will evaluate it this window.

The ``gamer`` behaviour (sim/behaviours/) trains only when it expects evaluation.  Here it is given the most
a miner could know: the validator's whole scoring state (who was checked and evaluated when, the top-G list,
even the validator's private secret) and that every peer will pass the fast checks — everything except
randomness that does not exist yet when it must upload.

* a predictable schedule (the least-recent baseline, scoring/schedules.py): S_t follows from that state alone,
  so the answer is 0 or 1.
* the drawn schedule: S_t is drawn from the chain randomness of a block produced after the uploads closed; the
  best the miner can do is average over the seeds it cannot know (``GUESSES`` seeds of its own).
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable

from dso.config.schema import HParams
from scoring import selection
from scoring.schedules import PURPOSE_EVAL, EvalSchedule
from scoring.state import ValidatorState
from scoring.window import is_banned, plan_fast_set

GUESSES = 32


def _selected(state: ValidatorState, hp: HParams, schedule: EvalSchedule, window: int, uid: int, active: list[int],
              seed: bytes) -> bool:
    fast = plan_fast_set(state, hp, window, active, seed, schedule)
    passed = [u for u in fast if u not in state.peers or not is_banned(state.peers[u], hp)]
    last_eval = {u: state.peers[u].last_eval_window if u in state.peers else -1 for u in passed}
    chosen = selection.eval_set(passed, last_eval.__getitem__, hp.eval_peers,
                                schedule.picker(state, hp, window, seed, PURPOSE_EVAL))
    return uid in chosen


def evaluation_chance(state: ValidatorState, hp: HParams, schedule: EvalSchedule, window: int, uid: int,
                      active: Iterable[int], guesses: int = GUESSES) -> float:
    """Probability, as far as the miner ``uid`` can tell before uploading, that it is in S_t of ``window``."""
    active = sorted(set(active))
    if schedule.predictable:  # the seed is not used: the validator's state decides
        return float(_selected(state, hp, schedule, window, uid, active, b"\0" * 32))
    seeds = [hashlib.sha256(f"guess/{uid}/{window}/{i}".encode()).digest() for i in range(guesses)]
    return sum(_selected(state, hp, schedule, window, uid, active, s) for s in seeds) / guesses
