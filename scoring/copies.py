"""Copied updates: two uids uploading the same update content in one window.

A copier reads an honest upload during the put window and re-uploads it under
its own uid; sybils upload one update under several uids.  Within a group of
identical updates (same content digest):

1. anyone who uploaded in a later second (S3 ``LastModified``) than the
   earliest member is rejected as a copy — they could have read it;
2. members tied in the earliest second are told apart by proof of computation:
   the update was trained on its author's assigned data, so one signed step
   with it lowers the loss on the author's data more than on anyone else's.
   The member with the largest ``L(θ, D_p) − L(θ', D_p)`` keeps the update.

Cost: two forward passes per tied member, only when a tie exists.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from dso.commit import content_digest
from dso.rejections import Reason, Rejection
from dso.train import evaluate
from scoring.evaluation import ParameterSnapshot, update_signs


def copy_groups(digests: Mapping[int, str]) -> list[list[int]]:
    groups: dict[str, list[int]] = {}
    for uid in sorted(digests):
        groups.setdefault(digests[uid], []).append(uid)
    return [uids for uids in groups.values() if len(uids) > 1]


def find_copies(codec: Any, updates: Mapping[int, Any], last_modified: Mapping[int, float], author_gain
                ) -> dict[int, Rejection]:
    """uid → DUPLICATE rejection for every member of a copy group but its author.

    ``author_gain(uids, update) -> {uid: gain}`` scores tied members (see :func:`assigned_gains`)."""
    digests = {uid: content_digest(codec.to_wire(u)) for uid, u in updates.items()}
    out: dict[int, Rejection] = {}
    for group in copy_groups(digests):
        first = min(math.floor(last_modified.get(u, math.inf)) for u in group)
        tied = [u for u in group if math.floor(last_modified.get(u, math.inf)) == first]
        for uid in group:
            if uid not in tied:
                out[uid] = Rejection(Reason.DUPLICATE, f"same update as uid {tied[0]}, uploaded later")
        if len(tied) > 1:
            gains = author_gain(tied, updates[tied[0]])
            author = max(tied, key=lambda u: (gains.get(u, -math.inf), -u))
            for uid in tied:
                if uid != author:
                    out[uid] = Rejection(Reason.DUPLICATE, f"same update as uid {author}, whose assigned data "
                                                           "it was trained on")
    return out


def assigned_gains(model: torch.nn.Module, codec: Any, dataset: Any, hp: Any, window: int, step: float
                   ) -> Any:
    """``author_gain`` for :func:`find_copies`: each tied uid's loss drop on its own assigned data."""

    def gain(uids: list[int], update: Any) -> dict[int, float]:
        shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        signs = update_signs(codec.decompress, update, shapes)
        if isinstance(signs, Rejection):
            return {}
        device = next(model.parameters()).device
        batches = {u: dataset.assigned(u, window, hp.batch_size)[: hp.eval_sequences] for u in uids}
        before = {u: evaluate(model, b, hp.micro_batch, device) for u, b in batches.items()}
        snapshot = ParameterSnapshot(model)
        try:
            with torch.no_grad():
                for name, p in model.named_parameters():
                    p.sub_(signs[name].to(p.device, p.dtype), alpha=step)
            after = {u: evaluate(model, b, hp.micro_batch, device) for u, b in batches.items()}
        finally:
            snapshot.restore()
        return {u: before[u] - after[u] for u in uids}

    return gain
