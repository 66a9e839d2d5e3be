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
from dso.outer import peer_norms, reference_norms
from scoring.evaluation import ParameterSnapshot, update_signs, update_step

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


def _median_norms(codec: Codec, updates: Mapping[int, Update]) -> dict[str, float]:
    norms = []
    for u in updates.values():
        try:
            norms.append(peer_norms(codec, u))
        except Exception:  # noqa: BLE001 — unreadable updates are rejected elsewhere
            continue
    return reference_norms(norms, list(codec.shapes))


def _control(mean: Mapping[str, torch.Tensor], like: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """sign(mean) (signed rule), or the mean rescaled per tensor to the norm of ``like``."""
    if like is None:
        return {n: torch.sign(d) for n, d in mean.items()}
    out: dict[str, torch.Tensor] = {}
    for n, d in mean.items():
        norm = float(torch.linalg.vector_norm(d))
        out[n] = d * (float(torch.linalg.vector_norm(like[n])) / norm) if norm > 0 else torch.zeros_like(d)
    return out


def assigned_gains(model: Decoder, codec: Codec, dataset: Dataset, hp: HParams, window: int, step: float,
                   updates: Mapping[int, Update]) -> AuthorGain:
    """``author_gain`` for :func:`find_copies`: for each tied uid, how much more a step with the copied
    update lowers the loss on the first ``batch_size`` sequences of its assignment (what a baseline miner
    trains on) than a step with the consensus of the window's other updates does."""

    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    signed = hp.outer.rule == "signed"
    reference = None if signed else _median_norms(codec, updates)

    def gain(tied: list[int], update: Update, group: list[int]) -> dict[int, float]:
        # the update's step as the network's outer rule would take it (scoring.evaluation.update_step), and
        # the consensus of the others rescaled to the same size per tensor: only the direction differs
        mine = update_signs(codec.decompress, update, shapes) if reference is None else \
            update_step(codec, update, hp, window, reference, shapes)
        if isinstance(mine, Rejection):
            return {}
        others = [updates[u] for u in sorted(updates) if u not in group]
        control = _control(codec.mean_delta(others), None if signed else mine) if others else None
        size = step if signed else 1.0
        batches = {u: dataset.training_batch(u, window, hp.assigned_sequences, hp.batch_size) for u in tied}
        with_control = _step_losses(model, control, size, batches, hp.micro_batch)
        with_update = _step_losses(model, mine, size, batches, hp.micro_batch)
        return {u: with_control[u] - with_update[u] for u in tied}

    return gain
