"""The disk cache of fetched corpus chunks: bounded, least recently used out first, one slot per process."""
from __future__ import annotations

from dso.data.chunk_cache import ChunkCache


def files(cache: ChunkCache) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in cache.dir.iterdir() if p.name != ".lock"}


def test_the_cache_keeps_the_most_recently_used_within_its_bound(tmp_path):
    cache = ChunkCache(tmp_path, 10_000)
    for i in range(4):
        cache.put(f"c.{i}", bytes([i]) * 3000)
    assert set(files(cache)) == {"c.1", "c.2", "c.3"} and cache.used == 9000   # c.0 made room for c.3
    assert cache.get("c.1") == b"\1" * 3000                                    # c.1 is now the most recent
    cache.put("c.4", b"\4" * 3000)
    assert set(files(cache)) == {"c.1", "c.3", "c.4"} and cache.get("c.2") is None
    cache.put("big", b"x" * 20_000)                                            # larger than the bound: not kept
    assert "big" not in cache and sum(files(cache).values()) == cache.used <= cache.peak <= 10_000
    cache.close()
    again = ChunkCache(tmp_path, 5_000)          # a restart with a smaller bound keeps the newest that fit
    assert again.dir == cache.dir and set(files(again)) == {"c.4"} and again.get("c.4") == b"\4" * 3000


def test_each_holder_gets_a_slot_of_its_own(tmp_path):
    # flock belongs to an open file description, so a second cache in this process contends for the slots
    # exactly as another process would
    held = ChunkCache(tmp_path, 1000)
    other = ChunkCache(tmp_path, 1000)
    assert held.dir.name == "slot-0" and other.dir.name == "slot-1"
    other.put("k", b"v")
    assert held.get("k") is None                  # slots do not share chunks nor count each other's bytes
    held.close()
    again = ChunkCache(tmp_path, 1000)
    assert again.dir.name == "slot-0"             # released when its holder closed it (or exited)


def test_half_written_files_are_dropped(tmp_path):
    cache = ChunkCache(tmp_path, 1000)
    (cache.dir / ".tmp-abc").write_bytes(b"partial")
    cache.put("k", b"v")
    cache.close()
    again = ChunkCache(tmp_path, 1000)
    assert set(files(again)) == {"k"}
