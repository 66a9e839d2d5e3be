"""Read-ahead chunks held in memory until read: bounded; past the bound chunks read already are dropped first,
then the oldest unread go to the spill (the disk cache)."""
from __future__ import annotations

from dso.data.held_chunks import HeldChunks


def test_held_chunks_stay_within_the_bound_read_ones_going_first_and_only_unread_ones_spill():
    spilled: list[tuple[int, bytes]] = []
    held: HeldChunks[int] = HeldChunks(10_000, lambda key, data: spilled.append((key, data)))
    for key in range(3):
        held.hold(key, bytes([key]) * 3000)
    assert held.take(1) == b"\1" * 3000 and held.take(1) == b"\1" * 3000   # read, and still there
    assert held.take(7) is None and 7 not in held
    held.hold(3, b"\3" * 3000)          # 12,000 > 10,000: 1, read already, goes (not the older 0, unread)
    assert 1 not in held and {0, 2, 3} == {k for k in range(4) if k in held} and not spilled
    held.hold(4, b"\4" * 3000)          # nothing read: the oldest unread, 0, goes to the spill
    held.hold(5, b"\5" * 3000)          # then 2
    assert spilled == [(0, b"\0" * 3000), (2, b"\2" * 3000)] and len(held) == 3
    assert (held.spilled, held.dropped) == (2, 1) and held.used == 9000 and held.peak <= 10_000


def test_a_chunk_held_again_replaces_the_old_copy_and_no_bound_holds_nothing():
    spilled: list[int] = []
    held: HeldChunks[str] = HeldChunks(5000, lambda key, data: spilled.append(len(data)))
    held.hold("a", b"x" * 4000)
    held.hold("a", b"y" * 4000)
    assert held.used == 4000 and held.take("a") == b"y" * 4000 and not spilled
    none: HeldChunks[str] = HeldChunks(0, lambda key, data: spilled.append(len(data)))
    none.hold("b", b"z" * 10)           # a bound of 0: every chunk goes straight to the spill
    assert "b" not in none and spilled == [10] and none.used == 0
