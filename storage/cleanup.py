"""Delete a peer's own objects older than a retention window.

Only keys of our layout (:func:`storage.keys.parse`) are touched; anything
else in the bucket is left alone.  Objects of another network run (an earlier
run in a reused bucket) are deleted whatever their window.  The newest
checkpoint of each protocol version of the current run (its manifest and its shards) is always kept, so
the "latest" pointer never dangles.
"""
from __future__ import annotations

from storage import keys
from storage.client import S3Client


def expired_keys(all_keys: list[str], current_window: int, retention_windows: int, run: str = "") -> list[str]:
    """Pure selection: keys of another run, and keys of ``run`` whose window < current_window - retention_windows."""
    if retention_windows < 0:
        raise ValueError("retention_windows must be >= 0")
    cutoff = current_window - retention_windows
    parsed = {k: keys.parse(k) for k in all_keys}
    newest_checkpoint: dict[int, int] = {}
    for p in parsed.values():
        if p is not None and p.kind == "checkpoint" and p.run == run:
            newest_checkpoint[p.version] = max(newest_checkpoint.get(p.version, -1), p.window)
    out = []
    for k, p in parsed.items():
        if p is None:
            continue
        if p.run != run:
            out.append(k)
            continue
        if p.window >= cutoff:
            continue
        if p.kind in ("checkpoint", "checkpoint_shard") and p.window == newest_checkpoint.get(p.version):
            continue
        out.append(k)
    return sorted(out)


def cleanup(client: S3Client, bucket: str, current_window: int, retention_windows: int, run: str = "") -> list[str]:
    """Delete expired objects from our own bucket; returns the keys deleted."""
    doomed = expired_keys([o.key for o in client.list(bucket)], current_window, retention_windows, run)
    if doomed:
        client.delete(bucket, doomed)
    return doomed
