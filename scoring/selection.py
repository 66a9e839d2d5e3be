"""Which peers get which check this window, and the next top-G list.

* F_t (fast checks): the top-G list in effect, then other active peers until
  ``fast_peers`` are chosen.
* S_t (primary evaluation): ``eval_peers`` of the F_t peers that passed the fast checks.
* How the "other" peers are picked (the schedules of scoring/schedules.py):
  - drawn (every node): drawn from the chain randomness of a block produced after
    the window's uploads closed (the *eval seed*), so no miner knows at upload time
    whether it will be checked.  The draw is weighted by the windows a peer has waited
    (weight = gap since it was last picked), and a peer that has waited
    ``ceil(factor · candidates / slots)`` windows is taken before any draw: every
    passing peer is evaluated within that bound.  The seed is public, so validators
    with the same history pick the same peers (their scores become comparable).
  - least recent (experiments only): the least recently picked first, ties broken by the validator's
    private randomness.  With 30 passing peers and 6 slots a peer is evaluated exactly
    every 5 windows, so a miner can train only in those: kept as the measured baseline
    (docs/scoring.md), not for production.
* Next top-G: the G best positive scores (ties: lower uid first).  When no
  peer has a positive score (cold start, or a window where every μ dipped
  below zero) the G peers that passed this window's fast checks, best
  (sign-safe, non-positive) score first, ties by uid — at a true cold start
  every score is 0, so that is simply the passing peers by uid.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from scoring.formulas import top_g

LastSeen = Callable[[int], int]             # uid → last window it was picked (-1: never)
Picker = Callable[[Iterable[int], LastSeen, int], list[int]]  # (candidates, last_seen, n) → chosen uids, sorted


def least_recent(candidates: Iterable[int], last_seen: LastSeen, n: int,
                 rng: np.random.Generator) -> list[int]:
    """``n`` candidates with the oldest ``last_seen`` window, random among equals; result sorted by uid."""
    pool = sorted(set(candidates))
    if n <= 0 or not pool:
        return []
    shuffled = [pool[i] for i in rng.permutation(len(pool))]
    shuffled.sort(key=last_seen)  # stable: the random order survives among equal windows
    return sorted(shuffled[:n])


def uniform_draws(seed: bytes, purpose: bytes, uids: Iterable[int]) -> dict[int, float]:
    """One number in (0, 1) per uid from SHA-256(seed ‖ purpose ‖ uid): the same on every node and numpy."""
    out = {}
    for uid in uids:
        digest = hashlib.sha256(bytes(seed) + purpose + int(uid).to_bytes(8, "little", signed=True)).digest()
        out[uid] = (int.from_bytes(digest[:8], "little") + 0.5) / 2.0 ** 64
    return out


def max_gap(candidates: int, slots: int, factor: float) -> int:
    """Windows after which a waiting candidate is taken without a draw: ceil(factor · candidates / slots)."""
    return max(1, math.ceil(factor * candidates / max(1, slots)))


def waited(window: int, last_seen: int) -> int:
    """Windows since a peer was last picked (≥ 1; a peer never picked has waited window + 1)."""
    return max(1, window - last_seen)


def weighted_draw(candidates: Iterable[int], last_seen: LastSeen, n: int, window: int, seed: bytes,
                  purpose: bytes, factor: float) -> list[int]:
    """``n`` candidates: the overdue ones first (longest wait first), the rest drawn without replacement with
    probability weights equal to their wait (Efraimidis–Spirakis keys log(U)/w from :func:`uniform_draws`).
    Result sorted by uid."""
    pool = sorted(set(candidates))
    if n <= 0 or not pool:
        return []
    if n >= len(pool):
        return pool
    wait = {uid: waited(window, last_seen(uid)) for uid in pool}
    u = uniform_draws(seed, purpose, pool)
    key = {uid: math.log(u[uid]) / wait[uid] for uid in pool}  # larger key = picked earlier
    bound = max_gap(len(pool), n, factor)
    overdue = sorted((uid for uid in pool if wait[uid] >= bound), key=lambda uid: (-wait[uid], -key[uid]))
    chosen = overdue[:n]
    rest = sorted((uid for uid in pool if uid not in chosen), key=lambda uid: -key[uid])
    return sorted(chosen + rest[:n - len(chosen)])


def least_recent_picker(rng: np.random.Generator) -> Picker:
    return lambda candidates, last_seen, n: least_recent(candidates, last_seen, n, rng)


def drawn_picker(window: int, seed: bytes, purpose: bytes, factor: float) -> Picker:
    if not isinstance(seed, (bytes, bytearray)) or len(seed) < 16:
        raise ValueError("the eval seed must be at least 16 bytes of chain randomness")
    return lambda candidates, last_seen, n: weighted_draw(candidates, last_seen, n, window, seed, purpose, factor)


def public_rng(window: int, seed: bytes, purpose: bytes) -> np.random.Generator:
    """Randomness every validator derives alike from the eval seed (a block after the uploads closed): the
    evaluation data of the random schedule.  Public once drawn, but unknown to a miner until its upload is
    fixed, so it cannot be trained on — and validators that share it score peers on the same sequences."""
    digest = hashlib.sha256(bytes(seed) + purpose + window.to_bytes(8, "little", signed=True)).digest()
    return np.random.default_rng([int.from_bytes(digest[i:i + 4], "little") for i in range(0, 32, 4)])


def fast_set(current_top_g: Iterable[int], active: Iterable[int], last_fast: LastSeen, size: int,
             pick: Picker) -> list[int]:
    """F_t: every active member of the current top-G, filled up to ``size`` by ``pick``."""
    active_set = set(active)
    core = sorted(set(current_top_g) & active_set)
    fill = pick(active_set - set(core), last_fast, size - len(core))
    return sorted(core + fill)


def eval_set(passed: Iterable[int], last_eval: LastSeen, size: int, pick: Picker) -> list[int]:
    """S_t: ``size`` of the peers that passed the fast checks."""
    return pick(passed, last_eval, size)


def next_top_g(scores: Mapping[int, float], passed: Iterable[int], g: int) -> list[int]:
    """The top-G list for the next window.

    Peers with a positive score, best first; while the list is short of G, peers that passed this window's
    checks with a score of exactly 0 (not evaluated yet, or neutral) follow, by uid — so a young network
    does not hang on one or two lucky peers, and a peer with a negative score never enters.  When that
    leaves nobody (early on μ is noisy for everyone), this window's passing peers, best first."""
    best = top_g(scores, g)
    neutral = sorted(u for u in set(passed) if scores.get(u, 0.0) == 0.0 and u not in best)
    chosen = (best + neutral)[:g]
    if chosen:
        return chosen
    return sorted(set(passed), key=lambda uid: (-scores.get(uid, 0.0), uid))[:g]
