"""A miner's upload under commit-reveal (``hparams.commit_reveal``; docs/extensions.md §2).

Window t:  put window → upload only the commitment ``commit/{t}/{uid}``;  from the first whole second after
the put window closed (:func:`dso.clock.reveal_time`) → upload the nonce and the payload.  Readers gather
after the reveal window (+ settle) and accept the payload only if it matches a timely commitment.

Behaviours that build their update from other miners' uploads (copier, alie, ipm) can read nothing during
the put window any more.  The best they can do is what this module does for them: commit to a placeholder
in time, read the honest reveals in the reveal window, and reveal a copy — which cannot match the
commitment (REVEAL_MISMATCH), or, re-committed, arrives late (NO_COMMIT).
"""
from __future__ import annotations

import logging
import time

from dso.clock import reveal_time, reveal_window_after
from dso.commit import new_nonce
from neurons.behaviours import LATE_BY
from storage.client import StorageError
from storage.reveal import put_commit, put_reveal, seal

log = logging.getLogger("dso.miner")
MIN_PUT_WINDOW_SECONDS = 1.5  # the reveal must wait for the next whole second after the close, then land
READ_AFTER_REVEALS = 0.5      # copier & co. read this long after the honest reveals start landing


def settings_problem(hp) -> str | None:
    """Why this run's settings cannot carry commit-reveal (None = fine)."""
    if hp.commit_reveal and hp.put_window_seconds < MIN_PUT_WINDOW_SECONDS:
        return (f"hparams.commit_reveal needs hparams.put_window_seconds >= {MIN_PUT_WINDOW_SECONDS} (the reveal "
                f"window is as long, and a reveal waits for the first whole second after the put window); "
                f"got {hp.put_window_seconds}")
    return None


def upload(miner, t: int, plan, own, put) -> bool:
    """Commit in window t's put window, reveal after it; True when a payload was revealed."""
    stop, version = miner.stop, miner.hp.protocol_version
    reveal_window = reveal_window_after(put)
    if plan.reads_peers:
        sealed = seal(new_nonce(), t, miner.uid)  # a placeholder: nothing to copy exists yet
    else:
        data = miner.build_payload(t, plan, own, put.open + 0.6, put.close)
        if data is None:
            return False
        sealed = seal(data, t, miner.uid)
    if plan.late and not miner.clock.sleep_until(put.close + LATE_BY, stop):
        return False
    try:
        put_commit(miner.client, miner.bucket, sealed, version)
    except StorageError as e:
        log.warning("window %d: commitment upload failed: %s", t, e)
        return False
    if not miner.clock.sleep_until(reveal_time(put), stop):
        return False
    if plan.reads_peers:
        data = miner.build_payload(t, plan, own, reveal_time(put) + READ_AFTER_REVEALS, reveal_window.close)
        if data is None:
            return False
        sealed = seal(data, t, miner.uid)  # the copy with a fresh nonce: it cannot match the commitment
    if time.time() > reveal_window.close:
        log.warning("window %d: past the reveal window; not revealing", t)
        return False
    try:
        put_reveal(miner.client, miner.bucket, sealed, version)
    except StorageError as e:
        log.warning("window %d: reveal failed: %s", t, e)
        return False
    return True
