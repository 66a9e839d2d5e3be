"""Contribution score per peer per round (ZIP-400 §5), from what a validator knows.

ZIP-400 scores a node by ``0.5·max(0, alignment) + 0.3·min(1, magnitude_ratio) + 0.2·validation_gain``.
Its terms map onto our protocol as follows (docs/extensions.md gives the reasons):

* alignment       → cosine between the peer's decoded (per-tensor normalised) update and the round's
  aggregate Δ before the sign; opposition earns nothing (max(0, ·)).
* magnitude_ratio → ZIP-400 uses a self-reported pre-clip norm, which an untrusted peer can inflate
  and which our scale-free aggregation ignores.  We use the proof-of-computation EMA μ_p ∈ [−1, 1]
  instead, clamped to [0, 1]: evidence the update carries signal from the peer's assigned data.
* validation_gain → the Gauntlet LossScore δ_rand of the round divided by the largest |δ_rand| among
  the peers evaluated that round, so it lies in [−1, 1] (harmful updates score negative); 0 when the
  peer was not in the evaluated subset S_t (no evidence, no credit).

So a score lies in [−0.2, 1].  Every component is recorded next to the total.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

WEIGHTS = (0.5, 0.3, 0.2)  # alignment, computation, validation gain (ZIP-400 §5)


@dataclass(frozen=True)
class Contribution:
    uid: int
    alignment: float    # cos(update, aggregate) in [−1, 1]
    computation: float  # μ_p clamped to [0, 1]
    gain: float         # normalised LossScore in [−1, 1]; 0 when not evaluated
    evaluated: bool
    score: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _finite(value: float) -> float:
    value = float(value)
    return value if math.isfinite(value) else 0.0


def contribution_score(alignment: float, computation: float, gain: float,
                       weights: tuple[float, float, float] = WEIGHTS) -> float:
    """0.5·max(0, alignment) + 0.3·clamp(computation, 0, 1) + 0.2·clamp(gain, −1, 1); non-finite → 0."""
    a, c, g = _finite(alignment), _finite(computation), _finite(gain)
    return (weights[0] * max(0.0, min(1.0, a)) + weights[1] * max(0.0, min(1.0, c))
            + weights[2] * max(-1.0, min(1.0, g)))


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """cos(a, b) in float64; 0 when either is zero or anything is non-finite."""
    a, b = a.reshape(-1).to(torch.float64), b.reshape(-1).to(torch.float64)
    denom = float(torch.linalg.vector_norm(a) * torch.linalg.vector_norm(b))
    if not math.isfinite(denom) or denom == 0:
        return 0.0
    return _finite(float(a @ b) / denom)


def normalised_gains(loss_scores: Mapping[int, float]) -> dict[int, float]:
    """δ_rand / max |δ_rand| over the round's evaluated peers (non-finite scores count as 0)."""
    finite = {uid: _finite(v) for uid, v in loss_scores.items()}
    scale = max((abs(v) for v in finite.values()), default=0.0)
    return {uid: (v / scale if scale > 0 else 0.0) for uid, v in finite.items()}


def round_contributions(updates: Mapping[int, torch.Tensor], aggregate: torch.Tensor,
                        mu: Mapping[int, float], loss_scores: Mapping[int, float]) -> dict[int, Contribution]:
    """Contribution of every peer whose update was read this round.

    ``updates``: uid → decoded update vector (e.g. a row of :func:`dso.aggregation.robust.decoded_rows`);
    ``aggregate``: the round's Δ before the sign (same layout); ``mu``: proof-of-computation EMA;
    ``loss_scores``: δ_rand of the peers evaluated this round (S_t)."""
    gains = normalised_gains(loss_scores)
    out: dict[int, Contribution] = {}
    for uid in sorted(updates):
        alignment = cosine(updates[uid], aggregate)
        computation = max(0.0, min(1.0, _finite(mu.get(uid, 0.0))))
        gain = gains.get(uid, 0.0)
        out[uid] = Contribution(uid, alignment, computation, gain, uid in gains,
                                contribution_score(alignment, computation, gain))
    return out
