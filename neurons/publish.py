"""How a miner publishes its payload: signed, the signature first, the bytes a lead later (storage/look.py).

The signature object (storage/signature.py) binds the digest of bytes nobody else holds yet; the validators'
watch (storage/look.py) reads it a round or more before the payload appears, which is the evidence of authorship
a copier cannot produce: it can sign a copy only after reading the payload (docs/decisions/0301).  Under
commit-reveal the signature travels with the reveal instead (neurons/reveal.py), where the commitment already
dates the payload.
"""
from __future__ import annotations

import logging
import threading
import time

from dso.chain.wallets import WalletError
from dso.protocol import signatures
from neurons.context import NodeContext
from storage import keys, signature
from storage.client import StorageError
from storage.look import signature_lead

log = logging.getLogger("dso.miner")


def sign(ctx: NodeContext, t: int, data: bytes) -> str | None:
    """Our hotkey's signature of window t's payload bytes (None, logged, if the wallet cannot sign)."""
    try:
        return signatures.sign_payload(ctx.wallet, ctx.run, t, ctx.uid, data)
    except WalletError as e:
        log.warning("window %d: cannot sign the payload: %s; not uploading", t, e)
        return None


def publish_payload(ctx: NodeContext, t: int, data: bytes, lead: float | None = None, wait: bool = True) -> bool:
    """Window t's signature, then (``lead`` seconds later; the run's :func:`signature_lead` by default) its payload,
    in our bucket.  ``wait``: return once both are up (True when they are); else return once the signature is up
    and put the payload from a thread, so the miner trains on while it waits (a failed put is logged)."""
    lead = signature_lead(ctx.hp.put_window_seconds) if lead is None else lead
    sig = sign(ctx, t, data)
    if sig is None:
        return False
    v = ctx.hp.protocol_version
    try:
        signature.put(ctx.own.client, ctx.own.bucket, ctx.run, t, ctx.uid, v, signatures.digest(data), sig)
    except StorageError as e:
        log.warning("window %d: upload failed: %s", t, e)
        return False
    due = time.time() + lead
    if not wait:  # not a daemon: a node that stops still finishes this put (at most the lead later)
        threading.Thread(target=_put_payload, args=(ctx, t, data, due), name=f"dso-upload-{t}").start()
        return True
    return _put_payload(ctx, t, data, due)


def _put_payload(ctx: NodeContext, t: int, data: bytes, due: float) -> bool:
    if not ctx.clock.sleep_until(due, ctx.stop):
        return False
    try:
        ctx.own.client.put(ctx.own.bucket, keys.gradient(t, ctx.uid, ctx.hp.protocol_version, ctx.run), data)
    except StorageError as e:
        log.warning("window %d: upload failed: %s", t, e)
        return False
    return True
