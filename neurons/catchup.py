"""Bring a node's model to the network's: apply the leader's window bundles, from a checkpoint if needed.

``model_window = w`` means the model is θ_w, the model peers train on in window
w; the bundle of window w (storage/aggregate.py) turns θ_w into θ_{w+1}.  Every
applied bundle is checked against the hashes the leader recorded before and
after it.  Following the network window by window and catching up after a gap
are the same operation: apply the next bundle.
"""
from __future__ import annotations

import logging

import torch

from dso.codec.codecs import Codec
from dso.config.schema import HParams
from dso.protocol.rejections import Reason, Rejection
from dso.training.outer import OuterState
from neurons.context import NodeContext, Source
from neurons.engine import aggregate_window
from neurons.theta import Theta, as_theta
from storage.aggregate import Bundle, get_bundle, unsigned
from storage.checkpoint import load_checkpoint, read_latest

log = logging.getLogger("dso.catchup")


def apply_bundle(model: torch.nn.Module | Theta, codec: Codec, hp: HParams, bundle: Bundle, outer: OuterState,
                 device: str | torch.device = "cpu") -> Rejection | None:
    """θ_w → θ_{w+1} (and the outer state) with the leader's bundle of window w, exactly as the validator
    computed it.

    The model and outer state must be at the bundle's ``model_hash_before`` / ``outer_digest_before``;
    when the result is not its ``model_hash_after`` / ``outer_digest_after`` both have changed and must
    be reloaded from a checkpoint."""
    if as_theta(model).hash() != bundle.model_hash_before:
        return Rejection(Reason.METADATA_MISMATCH, f"window {bundle.window}: model is not at model_hash_before")
    if outer.digest() != bundle.outer_digest_before:
        return Rejection(Reason.METADATA_MISMATCH, f"window {bundle.window}: outer state is not at "
                         "outer_digest_before")
    agg = aggregate_window(model, codec, hp, bundle.window, bundle.payloads, bundle.uids, outer, device,
                           hash_before=bundle.model_hash_before)  # just checked
    if agg.hash_after != bundle.model_hash_after or agg.outer_after != bundle.outer_digest_after:
        return Rejection(Reason.METADATA_MISMATCH, f"window {bundle.window}: replay did not reach model_hash_after")
    return None


def replay(ctx: NodeContext, model_window: int, target: int, source: Source) -> tuple[int, Rejection | None]:
    """Apply bundles model_window … target−1 from ``source`` = (client, bucket), stopping at the first that
    is missing, holds a payload its miner did not sign, or does not fit.  Returns (model window reached, why it
    stopped early or None)."""
    while model_window < target:
        bundle = get_bundle(*source, ctx.codec, ctx.hp, model_window, ctx.run)
        if isinstance(bundle, Rejection):
            return model_window, bundle
        forged = unsigned(bundle, ctx.peers.hotkeys(), ctx.run)  # only payloads their miners signed
        if forged:
            return model_window, next(iter(forged.values()))
        bad = apply_bundle(ctx.theta, ctx.codec, ctx.hp, bundle, ctx.outer, ctx.device)
        if bad:
            return model_window, bad
        model_window += 1
    return model_window, None


def sync_to(ctx: NodeContext, model_window: int, target: int) -> int:
    """Make the node's model θ_target as far as the leader's objects allow; returns the model window reached.

    Replays from where the model is.  Falls back on the leader's latest checkpoint when the model does not
    fit the next bundle (it diverged), or when the checkpoint is ahead of what replay reached (the bundles
    in between are gone or the node is new)."""
    source = ctx.peers.leader()
    if source is None or isinstance(source, Rejection) or not ctx.run:
        log.warning("catch-up: no leading validator's run to follow yet (%s)", source)
        return model_window
    if model_window >= 0:
        reached, stop = replay(ctx, model_window, target, source)
        if reached >= target:
            return reached
        diverged = stop is not None and stop.reason == Reason.METADATA_MISMATCH
    else:  # no model yet (new node) or one known to be wrong: start from a checkpoint
        reached, diverged = model_window, True
    pointer = read_latest(*source, ctx.hp.protocol_version, ctx.run)
    if isinstance(pointer, Rejection) or (pointer.window <= reached and not diverged):
        return reached
    ckpt = load_checkpoint(*source, pointer.window, ctx.shapes, ctx.hp, expect_hash=pointer.model_hash, run=ctx.run)
    if isinstance(ckpt, Rejection):
        log.warning("catch-up: checkpoint of window %d unusable: %s", pointer.window, ckpt)
        return reached
    ctx.theta.load_checkpoint(ckpt)
    ckpt.close()
    ctx.outer = ckpt.outer
    log.info("catch-up: loaded checkpoint of window %d (%s…)", ckpt.window, ckpt.model_hash[:10])
    reached, stop = replay(ctx, ckpt.window, target, source)
    if stop is not None and reached < target:
        log.info("catch-up: at window %d of %d (%s)", reached, target, stop)
    return reached
