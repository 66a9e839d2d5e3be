"""Choice of F_t, S_t and the next top-G list."""
from __future__ import annotations

from collections import Counter

import numpy as np

from scoring.selection import eval_set, fast_set, least_recent, next_top_g


def test_fast_set_always_holds_the_active_top_g_and_has_the_requested_size():
    rng = np.random.default_rng(0)
    chosen = fast_set([4, 9, 42], range(10), lambda uid: -1, 5, rng)
    assert {4, 9} <= set(chosen) and 42 not in chosen          # 42 is no longer registered
    assert len(chosen) == 5 and chosen == sorted(chosen)
    assert set(fast_set(range(8), range(10), lambda uid: -1, 3, rng)) == set(range(8))   # top-G beats the cap


def test_rotation_covers_every_peer_equally_often():
    last_fast: dict[int, int] = {}
    last_eval: dict[int, int] = {}
    checked, evaluated = Counter(), Counter()
    for window in range(30):
        rng = np.random.default_rng(window)
        f = fast_set([0], range(12), lambda uid: last_fast.get(uid, -1), 4, rng)
        s = eval_set(f, lambda uid: last_eval.get(uid, -1), 2, rng)
        for uid in f:
            last_fast[uid] = window
        for uid in s:
            last_eval[uid] = window
        checked.update(f)
        evaluated.update(s)
    assert checked[0] == 30                                     # the top-G peer is checked every window
    others = [checked[u] for u in range(1, 12)]
    assert max(others) - min(others) <= 1                       # 3 slots for 11 peers: round robin
    assert sum(evaluated.values()) == 60 and set(evaluated) == set(range(12))


def test_least_recent_breaks_ties_with_the_given_randomness():
    picks = {tuple(least_recent(range(10), lambda uid: 0, 3, np.random.default_rng(seed))) for seed in range(20)}
    assert len(picks) > 5                                       # unpredictable without the secret
    same = least_recent(range(10), lambda uid: 0, 3, np.random.default_rng(5))
    assert same == least_recent(range(10), lambda uid: 0, 3, np.random.default_rng(5))
    assert least_recent(range(10), lambda uid: uid, 3, np.random.default_rng(5)) == [0, 1, 2]
    assert least_recent([], lambda uid: 0, 3, np.random.default_rng(5)) == []


def test_next_top_g_positive_scores_then_neutral_else_cold_start():
    assert next_top_g({1: 0.5, 2: 0.7, 3: 0.0}, passed=[1, 2, 3], g=5) == [2, 1, 3]   # neutral 3 fills up
    assert next_top_g({1: 0.5, 2: 0.7, 3: 0.0}, passed=[1, 2, 3], g=2) == [2, 1]
    assert next_top_g({1: 0.5, 2: -0.1, 3: 0.0, 4: 0.0}, passed=[2, 4], g=5) == [1, 4]  # negative never enters
    assert next_top_g({1: 0.0, 2: -0.1, 3: 0.0, 4: 0.0}, passed=[4, 3, 1], g=2) == [1, 3]   # cold start, by uid
    assert next_top_g({1: 0.0}, passed=[], g=2) == []
    # no positive score mid-run: the passing peers whose worse factor is least bad come first
    assert next_top_g({1: -0.9, 2: -0.002, 3: -4.0, 4: -0.002}, passed=[1, 2, 3, 4], g=3) == [2, 4, 1]
