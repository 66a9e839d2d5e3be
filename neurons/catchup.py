"""Bring a node's model to the network's: replay the leader's published aggregates, from a checkpoint if needed.

``model_window = w`` means the model is θ_w, the model peers train on in window
w; the aggregate of window w turns θ_w into θ_{w+1}.  Every replayed step is
checked against the hashes the validator recorded before and after it.
"""
from __future__ import annotations

import logging

import torch

from dso.model import model_hash
from dso.rejections import Reason, Rejection
from neurons.context import NodeContext, Source
from storage.aggregate import apply_aggregate, get_aggregate
from storage.checkpoint import load_checkpoint, read_latest

log = logging.getLogger("dso.catchup")


def replay(ctx: NodeContext, model: torch.nn.Module, model_window: int, target: int, source: Source
           ) -> tuple[int, Rejection | None]:
    """Apply aggregates model_window … target−1 from ``source`` = (client, bucket), stopping at the first
    that is missing or does not fit.  Returns (model window reached, why it stopped early or None)."""
    client, bucket = source
    while model_window < target:
        agg = get_aggregate(client, bucket, model_window, ctx.shapes, ctx.hp)
        if isinstance(agg, Rejection):
            return model_window, agg
        bad = apply_aggregate(model, agg, ctx.hp.weight_decay)
        if bad:
            return model_window, bad
        model_window += 1
    return model_window, None


def sync_to(ctx: NodeContext, model_window: int, target: int) -> int:
    """Make the node's model θ_target as far as the leader's objects allow; returns the model window reached.

    Replays from where the model is.  Falls back on the leader's latest checkpoint when the model does not
    fit the next aggregate (it diverged), or when the checkpoint is ahead of what replay reached (the
    aggregates in between are gone or the node is new)."""
    model = ctx.model
    source = ctx.peers.leader()
    if source is None or isinstance(source, Rejection):
        log.warning("catch-up: no leading validator bucket (%s)", source)
        return model_window
    if model_window >= 0:
        reached, stop = replay(ctx, model, model_window, target, source)
        if reached >= target:
            return reached
        diverged = stop is not None and stop.reason == Reason.METADATA_MISMATCH
    else:  # no model yet (new node) or one known to be wrong: start from a checkpoint
        reached, diverged = model_window, True
    pointer = read_latest(*source, ctx.hp.protocol_version)
    if isinstance(pointer, Rejection) or (pointer.window <= reached and not diverged):
        return reached
    ckpt = load_checkpoint(*source, pointer.window, ctx.shapes, ctx.hp, expect_hash=pointer.model_hash)
    if isinstance(ckpt, Rejection):
        log.warning("catch-up: checkpoint of window %d unusable: %s", pointer.window, ckpt)
        return reached
    ckpt.load_into(model)
    log.info("catch-up: loaded checkpoint of window %d (%s…)", ckpt.window, model_hash(model)[:10])
    reached, stop = replay(ctx, model, ckpt.window, target, source)
    if stop is not None and reached < target:
        log.info("catch-up: at window %d of %d (%s)", reached, target, stop)
    return reached
