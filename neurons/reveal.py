"""A miner's upload under commit-reveal (``hparams.commit_reveal``; docs/extensions.md §2).

Window t:  put window → upload only the commitment ``commit/{t}/{uid}``;  from the first whole second after
the put window closed (:func:`dso.protocol.clock.reveal_time`) → upload the nonce, the signature and the payload.
Readers gather
after the reveal window (+ settle) and accept the payload only if it matches a timely commitment.
"""
from __future__ import annotations

import logging
import time

from dso.config.schema import HParams
from dso.protocol.clock import PutWindow, reveal_time, reveal_window_after
from neurons.context import NodeContext
from neurons.publish import sign
from storage.client import StorageError
from storage.reveal import Sealed, put_commit, put_reveal, seal

log = logging.getLogger("dso.miner")
MIN_PUT_WINDOW_SECONDS = 1.5  # the reveal must wait for the next whole second after the close, then land


def settings_problem(hp: HParams) -> str | None:
    """Why this run's settings cannot carry commit-reveal (None = fine)."""
    if hp.commit_reveal and hp.put_window_seconds < MIN_PUT_WINDOW_SECONDS:
        return (f"hparams.commit_reveal needs hparams.put_window_seconds >= {MIN_PUT_WINDOW_SECONDS} (the reveal "
                f"window is as long, and a reveal waits for the first whole second after the put window); "
                f"got {hp.put_window_seconds}")
    return None


def commit(ctx: NodeContext, sealed: Sealed) -> bool:
    try:
        put_commit(ctx.own.client, ctx.own.bucket, sealed, ctx.hp.protocol_version, ctx.run)
    except StorageError as e:
        log.warning("window %d: commitment upload failed: %s", sealed.window, e)
        return False
    return True


def reveal(ctx: NodeContext, sealed: Sealed, put: PutWindow) -> bool:
    """Upload the nonce and the payload once the reveal window has begun (and before it closes)."""
    if not ctx.clock.sleep_until(reveal_time(put), ctx.stop):
        return False
    if time.time() > reveal_window_after(put).close:
        log.warning("window %d: past the reveal window; not revealing", sealed.window)
        return False
    try:
        put_reveal(ctx.own.client, ctx.own.bucket, sealed, ctx.hp.protocol_version, ctx.run)
    except StorageError as e:
        log.warning("window %d: reveal failed: %s", sealed.window, e)
        return False
    return True


def upload(ctx: NodeContext, t: int, payload: bytes, put: PutWindow) -> bool:
    """Commit in window t's put window, reveal after it (the nonce, our signature of the payload, the payload);
    True when the payload was revealed."""
    sig = sign(ctx, t, payload)
    if sig is None:
        return False
    sealed = seal(payload, t, ctx.uid, signature=sig)
    return commit(ctx, sealed) and reveal(ctx, sealed, put)
