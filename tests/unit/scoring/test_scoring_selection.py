"""Choice of F_t, S_t and the next top-G list."""
from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np

from scoring.selection import (
    drawn_picker,
    eval_set,
    fast_set,
    least_recent,
    least_recent_picker,
    max_gap,
    next_top_g,
    uniform_draws,
    weighted_draw,
)


def test_fast_set_always_holds_the_active_top_g_and_has_the_requested_size():
    for pick in (least_recent_picker(np.random.default_rng(0)), drawn_picker(3, b"\x05" * 32, b"fast", 2.0)):
        chosen = fast_set([4, 9, 42], range(10), lambda uid: -1, 5, pick)
        assert {4, 9} <= set(chosen) and 42 not in chosen          # 42 is no longer registered
        assert len(chosen) == 5 and chosen == sorted(chosen)
        assert set(fast_set(range(8), range(10), lambda uid: -1, 3, pick)) == set(range(8))  # top-G beats the cap


def test_rotation_covers_every_peer_equally_often():
    last_fast: dict[int, int] = {}
    last_eval: dict[int, int] = {}
    checked, evaluated = Counter(), Counter()
    for window in range(30):
        pick = least_recent_picker(np.random.default_rng(window))
        f = fast_set([0], range(12), lambda uid: last_fast.get(uid, -1), 4, pick)
        s = eval_set(f, lambda uid: last_eval.get(uid, -1), 2, pick)
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


# ------------------------------------------------- the drawn schedule (scoring/schedules.py DRAWN)
def _run_schedule(pick_for_window, peers: int, slots: int, windows: int):
    """Evaluate ``slots`` of ``peers`` each window; returns (gaps between evaluations, P(picked | wait))."""
    last = {u: -1 for u in range(peers)}
    gaps, seen, picked = [], Counter(), Counter()
    for window in range(windows):
        wait = {u: max(1, window - last[u]) for u in range(peers)}
        if window >= 50:  # after the cold start, when nobody has been evaluated yet
            seen.update(wait.values())
        chosen = eval_set(range(peers), last.__getitem__, slots, pick_for_window(window))
        assert len(chosen) == slots and len(set(chosen)) == slots
        for u in chosen:
            picked[wait[u]] += window >= 50
            if last[u] >= 0:
                gaps.append(window - last[u])
            last[u] = window
    return gaps, {w: picked[w] / seen[w] for w in seen if seen[w] >= 200}


def test_round_robin_is_predictable_and_the_draw_is_not():
    """30 passing peers, 6 slots: the old order evaluates every peer exactly every 5 windows, so a peer knows
    its next evaluation; the draw gives no wait a chance above 1/2 until the hard bound."""
    old, old_chance = _run_schedule(lambda w: least_recent_picker(np.random.default_rng(w)), 30, 6, 400)
    assert set(old[30:]) == {5} and old_chance[5] == 1.0 and all(old_chance[w] == 0.0 for w in (1, 2, 3, 4))
    seed = lambda w: hashlib.sha256(f"block after window {w}".encode()).digest()  # noqa: E731
    new, chance = _run_schedule(lambda w: drawn_picker(w, seed(w), b"eval", 2.0), 30, 6, 3000)
    bound = max_gap(30, 6, 2.0)
    assert bound == 10 and max(new) == bound                    # the coverage guarantee holds, and binds
    assert abs(sum(new) / len(new) - 5.0) < 0.1                 # the same evaluation rate as before
    assert chance[bound] == 1.0
    assert all(0.03 < chance[w] < 0.5 for w in range(1, bound))  # before the bound: never more likely than not
    assert all(chance[w] < chance[w + 1] for w in range(1, bound - 1))  # weighted toward the longest wait


def test_the_draw_is_a_function_of_the_public_seed_only():
    last = {u: (u * 7) % 5 for u in range(20)}.__getitem__
    a = weighted_draw(range(20), last, 4, 9, b"\x01" * 32, b"eval", 2.0)
    assert a == weighted_draw(reversed(range(20)), last, 4, 9, b"\x01" * 32, b"eval", 2.0)  # any validator
    assert a != weighted_draw(range(20), last, 4, 9, b"\x02" * 32, b"eval", 2.0)
    assert a != weighted_draw(range(20), last, 4, 9, b"\x01" * 32, b"fast", 2.0)           # purposes differ
    draws = uniform_draws(b"\x01" * 32, b"eval", range(1000))
    assert 0 < min(draws.values()) and max(draws.values()) < 1
    assert abs(np.mean(list(draws.values())) - 0.5) < 0.03


def test_draw_frequencies_follow_the_waits():
    """Efraimidis–Spirakis with one slot: P(pick u) = w_u / Σ w (checked against the exact weights)."""
    waits = {0: 1, 1: 2, 2: 3, 3: 4}
    window = 10
    last = {u: window - w for u, w in waits.items()}.__getitem__
    counts = Counter(weighted_draw(range(4), last, 1, window, hashlib.sha256(str(i).encode()).digest(), b"e",
                                   100.0)[0] for i in range(20000))
    for u, w in waits.items():
        assert abs(counts[u] / 20000 - w / 10) < 0.015


def test_overdue_peers_come_first_longest_wait_first():
    last = {0: 0, 1: 0, 2: 0, 3: 10, 4: 10, 5: 10}.__getitem__
    # window 11, 6 candidates, 2 slots, factor 1: the bound is 3 windows; uids 0–2 waited 11
    assert max_gap(6, 2, 1.0) == 3
    chosen = weighted_draw(range(6), last, 2, 11, b"\x03" * 32, b"eval", 1.0)
    assert set(chosen) <= {0, 1, 2}
    last = {0: 1, 1: 0, 2: 5, 3: 10, 4: 10, 5: 10}.__getitem__
    assert weighted_draw(range(6), last, 1, 11, b"\x03" * 32, b"eval", 1.0) == [1]
    assert weighted_draw(range(3), last, 5, 11, b"\x03" * 32, b"eval", 1.0) == [0, 1, 2]
    assert weighted_draw([], last, 2, 11, b"\x03" * 32, b"eval", 1.0) == []


def test_a_short_seed_is_refused():
    import pytest
    with pytest.raises(ValueError, match="16 bytes"):
        drawn_picker(0, b"abc", b"eval", 2.0)
