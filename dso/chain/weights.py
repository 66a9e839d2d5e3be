"""Turning a validator's weights into a post the chain accepts, or a refusal that says why and when.

Pure: the caller passes the chain's :class:`WeightRules`, the subnet's uids,
its own uid and last update, and the current block.  :func:`plan_weights`

* refuses a version key below the subnet's (``outdated_version``) and a post
  sooner than the rate limit allows (``rate_limited``, with the block from which
  the next post is allowed);
* drops non-finite, negative and zero entries and uids not registered;
* meets ``min_allowed_weights`` by padding with the smallest weight that
  survives the chain's u16 quantisation (``max / 32768``: it quantises to 2)
  on the lowest other uids, or refuses (``too_few_weights``) with ``pad=False``
  or when the subnet has too few uids;
* clips the row to ``max_weight_limit`` as the chain (or the SDK) would, so the
  plan is the row the chain will keep, and says so (``clipped``).

On a commit-reveal subnet the post is hidden until revealed: ``reveals_later``
tells the caller that reading weights back shows the previous row.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from dso.chain import rules
from dso.chain.base import ChainError, WeightRules

PAD_FRACTION = 1.0 / 32768  # of the largest weight: 2 after the SDK's max-upscaled u16 quantisation


@dataclass(frozen=True)
class WeightPlan:
    uids: list[int]
    weights: list[float]            # normalised (sum 1) and clipped: what the chain will keep
    version_key: int
    clipped: bool = False           # max_weight_limit changed the row
    padded: list[int] = field(default_factory=list)   # uids given a minimal weight to reach the minimum
    reveals_later: bool = False     # commit-reveal: the row is read back only after its reveal


@dataclass(frozen=True)
class WeightRefusal:
    reason: str                     # a dso.chain.rules reason code
    message: str
    next_allowed_block: int | None = None


def next_post_block(last_update: int, rate_limit_blocks: int) -> int:
    """First block at which a hotkey that last posted at ``last_update`` may post again (0 = never posted)."""
    return last_update + rate_limit_blocks if last_update > 0 else 0


def plan_weights(scores: dict[int, float], chain_rules: WeightRules, *, version_key: int, registered: list[int],
                 own_uid: int | None, last_update: int, now: int, pad: bool = True) -> WeightPlan | WeightRefusal:
    """What to post for ``scores`` (uid -> non-negative weight, any scale), or why not now."""
    if version_key < chain_rules.version_key:
        return WeightRefusal(rules.OUTDATED_VERSION, f"version key {version_key} is below the subnet's weights "
                             f"version {chain_rules.version_key}: upgrade, or set --subtensor.weights_version")
    allowed = next_post_block(last_update, chain_rules.rate_limit_blocks)
    if now < allowed:
        return WeightRefusal(rules.RATE_LIMITED, f"last post at block {last_update}, rate limit "
                             f"{chain_rules.rate_limit_blocks} blocks: next post at block {allowed}", allowed)
    members = set(registered)
    kept = {int(u): float(w) for u, w in scores.items()
            if u in members and isinstance(w, (int, float)) and math.isfinite(w) and w > 0}
    if not kept:
        return WeightRefusal(rules.BAD_WEIGHTS, "no positive weight on a registered uid")
    needed = rules.required_weights(chain_rules.min_allowed_weights, len(members))
    padded: list[int] = []
    if len(kept) < needed and not rules.is_self_weight(kept, own_uid):
        spare = sorted(u for u in members if u not in kept and u != own_uid)
        if not pad or len(kept) + len(spare) < needed:
            return WeightRefusal(rules.TOO_FEW_WEIGHTS, f"{len(kept)} positive weights; the subnet needs "
                                 f"{needed}" + ("" if pad else " (padding is off)"))
        padded = spare[:needed - len(kept)]
        floor = max(kept.values()) * PAD_FRACTION
        kept.update({u: floor for u in padded})
    row = rules.clip_max_weight(kept, 1.0)
    clipped = False
    if chain_rules.max_weight_limit < 1 and not rules.is_self_weight(row, own_uid):
        limited = rules.clip_max_weight(row, chain_rules.max_weight_limit)
        clipped = any(abs(limited[u] - row[u]) > 1e-12 for u in row)
        row = limited
    uids = sorted(row)
    return WeightPlan(uids, [row[u] for u in uids], version_key, clipped, padded, chain_rules.commit_reveal)


class WeightsRefused(ChainError):
    """Raised by :meth:`dso.chain.base.Chain.post_weights`; ``refusal`` holds the reason and next block."""

    def __init__(self, refusal: WeightRefusal):
        super().__init__(refusal.reason, refusal.message)
        self.refusal = refusal
