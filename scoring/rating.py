"""LossRating: an OpenSkill Plackett–Luce match over the evaluated peers, ranked by LossScore.

Ratings live in the validator state as plain ``(mu, sigma)`` floats; an
OpenSkill rating object is built only for the duration of one match.  The
library's ``rate`` returns *new* objects, whose ``mu``/``sigma`` we read back.
Model parameters are the library defaults (μ₀ = 25, σ₀ = 25/3, β = 25/6,
τ = 25/300), so a peer that was never rated has ordinal μ₀ − 3σ₀ = 0.
"""
from __future__ import annotations

import math
from typing import Mapping

from openskill.models import PlackettLuce

from scoring.formulas import competition_ranks

ORDINAL_Z = 3.0  # LossRating = μ − 3σ (design §6.1)

_MODEL = PlackettLuce()
# Bounds of a stored rating (docs/scoring.md, "Bounds"): far outside anything a run reaches (a peer that
# wins every match moves μ by well under σ₀ per match, and σ shrinks), but they make the rating, the
# LossRating and the PeerScore finite and bounded by construction, whatever the library returns.
RATING_MU_BOUND = 1000.0
SIGMA_MIN, SIGMA_MAX = 1e-3, 2 * _MODEL.sigma

Rating = tuple[float, float]  # (mu, sigma)


def initial_rating() -> Rating:
    return (_MODEL.mu, _MODEL.sigma)


def ordinal(rating: Rating) -> float:
    mu, sigma = rating
    return mu - ORDINAL_Z * sigma


def rate_match(ratings: Mapping[int, Rating], loss_scores: Mapping[int, float]) -> dict[int, Rating]:
    """New ratings of every peer in ``loss_scores`` after one match ranked by LossScore (higher = better).

    Equal LossScores are a draw between those peers; NaN ranks last.  A match
    needs two players: with fewer, ratings are returned unchanged.  Peers are
    entered in uid order so the result does not depend on dict order."""
    uids = sorted(loss_scores)
    current = {uid: bound_rating(ratings.get(uid, initial_rating())) for uid in uids}
    if len(uids) < 2:
        return current
    ranks = competition_ranks({uid: loss_scores[uid] for uid in uids})
    teams = [[_MODEL.rating(mu=current[uid][0], sigma=current[uid][1])] for uid in uids]
    new_teams = _MODEL.rate(teams, ranks=[float(ranks[uid]) for uid in uids])
    out: dict[int, Rating] = {}
    for uid, team in zip(uids, new_teams):
        mu, sigma = float(team[0].mu), float(team[0].sigma)
        # A library result that is not finite would poison every later match: keep the old rating.
        out[uid] = bound_rating((mu, sigma) if math.isfinite(mu) and math.isfinite(sigma) and sigma > 0
                                else current[uid])
    return out


def bound_rating(rating: Rating) -> Rating:
    """``(μ, σ)`` clamped to ``|μ| ≤ RATING_MU_BOUND`` and ``SIGMA_MIN ≤ σ ≤ SIGMA_MAX`` (finite inputs)."""
    mu, sigma = rating
    return (min(RATING_MU_BOUND, max(-RATING_MU_BOUND, mu)), min(SIGMA_MAX, max(SIGMA_MIN, sigma)))
