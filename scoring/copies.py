"""Copied updates: two uids uploading the same update content in one window.

A copier reads an honest upload during the put window and re-uploads it under
its own uid; sybils upload one update under several uids.  Within a group of
identical updates (same content digest):

1. anyone who uploaded in a later second (S3 ``LastModified``) than the
   earliest member is rejected as a copy — they could have read it;
2. members tied in the earliest second are told apart by proof of computation:
   the update U was trained on its author's assigned data, so a signed step
   with it helps the author's data more than anyone else's.  How "improvable"
   a batch is varies a lot from batch to batch, so each member's data is also
   stepped with a control V — the consensus of the window's other updates —
   and the member with the largest ``L(θ − s·sign V, D_p) − L(θ − s·sign U, D_p)``
   keeps the update (the unstepped loss cancels out of the comparison).

Cost: two forward passes per tied member, only when a tie exists.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Mapping

import torch

from dso.codecs import Codec, Update
from dso.commit import content_digest
from dso.model import Decoder
from dso.rejections import Reason, Rejection
from dso.train import evaluate
from scoring.evaluation import ParameterSnapshot, update_signs

if TYPE_CHECKING:
    from dso.config import HParams
    from dso.data import Dataset

# (tied uids, their shared update, the whole copy group) -> uid -> gain
AuthorGain = Callable[[list[int], Update, list[int]], dict[int, float]]


def copy_groups(digests: Mapping[int, str]) -> list[list[int]]:
    groups: dict[str, list[int]] = {}
    for uid in sorted(digests):
        groups.setdefault(digests[uid], []).append(uid)
    return [uids for uids in groups.values() if len(uids) > 1]


def find_copies(codec: Codec, updates: Mapping[int, Update], last_modified: Mapping[int, float],
                author_gain: AuthorGain) -> dict[int, Rejection]:
    """uid → DUPLICATE rejection for every member of a copy group but its author.

    ``author_gain(tied, update, group) -> {uid: gain}`` scores the tied members of a group (see
    :func:`assigned_gains`)."""
    digests = {uid: content_digest(codec.to_wire(u)) for uid, u in updates.items()}
    out: dict[int, Rejection] = {}
    for group in copy_groups(digests):
        first = min(math.floor(last_modified.get(u, math.inf)) for u in group)
        tied = [u for u in group if math.floor(last_modified.get(u, math.inf)) == first]
        for uid in group:
            if uid not in tied:
                out[uid] = Rejection(Reason.DUPLICATE, f"same update as uid {tied[0]}, uploaded later")
        if len(tied) > 1:
            gains = author_gain(tied, updates[tied[0]], group)
            author = max(tied, key=lambda u: (gains.get(u, -math.inf), -u))
            for uid in tied:
                if uid != author:
                    out[uid] = Rejection(Reason.DUPLICATE, f"same update as uid {author}, whose assigned data "
                                                           "it was trained on")
    return out


def _step_losses(model: Decoder, signs: dict[str, torch.Tensor] | None, step: float, batches: dict[int, torch.Tensor],
                 micro_batch: int) -> dict[int, float]:
    """Loss of each batch at θ − step·signs (θ itself when ``signs`` is None); θ is restored exactly."""
    device = next(model.parameters()).device
    if signs is None:
        return {u: evaluate(model, b, micro_batch, device) for u, b in batches.items()}
    snapshot = ParameterSnapshot(model)
    try:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.sub_(signs[name].to(p.device, p.dtype), alpha=step)
        return {u: evaluate(model, b, micro_batch, device) for u, b in batches.items()}
    finally:
        snapshot.restore()


def assigned_gains(model: Decoder, codec: Codec, dataset: Dataset, hp: HParams, window: int, step: float,
                   updates: Mapping[int, Update]) -> AuthorGain:
    """``author_gain`` for :func:`find_copies`: for each tied uid, how much more a step with the copied
    update lowers the loss on the first ``batch_size`` sequences of its assignment (what a baseline miner
    trains on) than a step with the consensus of the window's other updates does."""

    def gain(tied: list[int], update: Update, group: list[int]) -> dict[int, float]:
        shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        signs = update_signs(codec.decompress, update, shapes)
        if isinstance(signs, Rejection):
            return {}
        others = [updates[u] for u in sorted(updates) if u not in group]
        control = {n: torch.sign(d) for n, d in codec.mean_delta(others).items()} if others else None
        batches = {u: dataset.training_batch(u, window, hp.assigned_sequences, hp.batch_size) for u in tied}
        with_control = _step_losses(model, control, step, batches, hp.micro_batch)
        with_update = _step_losses(model, signs, step, batches, hp.micro_batch)
        return {u: with_control[u] - with_update[u] for u in tied}

    return gain
