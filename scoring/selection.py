"""Which peers get which check this window, and the next top-G list.

* F_t (fast checks): the top-G list in effect, then the peers checked least
  recently, until ``fast_peers`` are chosen.
* S_t (primary evaluation): among F_t peers that passed the fast checks, the
  least recently evaluated first, so over time every peer is evaluated about
  equally often.
* Ties in "least recently" are broken by the validator's private randomness, so
  a miner cannot predict whether it will be evaluated.
* Next top-G: the G best positive scores (ties: lower uid first).  When no
  peer has a positive score (cold start, or a window where every μ dipped
  below zero) the G peers that passed this window's fast checks, best
  (sign-safe, non-positive) score first, ties by uid — at a true cold start
  every score is 0, so that is simply the passing peers by uid.
"""
from __future__ import annotations

from typing import Callable, Iterable, Mapping

import numpy as np

from scoring.formulas import top_g


def least_recent(candidates: Iterable[int], last_seen: Callable[[int], int], n: int,
                 rng: np.random.Generator) -> list[int]:
    """``n`` candidates with the oldest ``last_seen`` window, random among equals; result sorted by uid."""
    pool = sorted(set(candidates))
    if n <= 0 or not pool:
        return []
    shuffled = [pool[i] for i in rng.permutation(len(pool))]
    shuffled.sort(key=last_seen)  # stable: the random order survives among equal windows
    return sorted(shuffled[:n])


def fast_set(current_top_g: Iterable[int], active: Iterable[int], last_fast: Callable[[int], int], size: int,
             rng: np.random.Generator) -> list[int]:
    """F_t: every active member of the current top-G, filled up to ``size`` by least-recently checked."""
    active_set = set(active)
    core = sorted(set(current_top_g) & active_set)
    fill = least_recent(active_set - set(core), last_fast, size - len(core), rng)
    return sorted(core + fill)


def eval_set(passed: Iterable[int], last_eval: Callable[[int], int], size: int,
             rng: np.random.Generator) -> list[int]:
    """S_t: ``size`` of the peers that passed the fast checks, least recently evaluated first."""
    return least_recent(passed, last_eval, size, rng)


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
