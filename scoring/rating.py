"""LossRating: an OpenSkill Plackett–Luce match over the evaluated peers, ranked by LossScore.

Ratings live in the validator state as plain ``(mu, sigma)`` floats; an
OpenSkill rating object is built only for the duration of one match.  The
library's ``rate`` returns *new* objects, whose ``mu``/``sigma`` we read back.
The prior is the library's (μ₀ = 25, σ₀ = 25/3); β (performance noise) and τ (the dynamics
that keep σ from collapsing: the rating's horizon) are run hyper-parameters (``hparams.rating_beta``,
``hparams.rating_tau``; the library defaults are 25/6 and 25/300).  The LossRating is the ordinal
μ − z·σ with ``hparams.rating_z`` (the library's z = 3 gives a fresh peer exactly 0).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache

from openskill.models import PlackettLuce

from scoring.formulas import competition_ranks

ORDINAL_Z = 3.0  # the library's ordinal μ − 3σ (design §6.1)
LIBRARY_BETA, LIBRARY_TAU = 25 / 6, 25 / 300  # the library's defaults (scale of μ₀ = 25)

_MODEL = PlackettLuce()  # the prior (μ₀, σ₀) of every model below
# Bounds of a stored rating (docs/scoring.md, "Bounds"): far outside anything a run reaches (a peer that
# wins every match moves μ by well under σ₀ per match, and σ shrinks), but they make the rating, the
# LossRating and the PeerScore finite and bounded by construction, whatever the library returns.
RATING_MU_BOUND = 1000.0
SIGMA_MIN, SIGMA_MAX = 1e-3, 2 * _MODEL.sigma

Rating = tuple[float, float]  # (mu, sigma)


def initial_rating() -> Rating:
    return (_MODEL.mu, _MODEL.sigma)


@lru_cache(maxsize=8)
def model(beta: float = LIBRARY_BETA, tau: float = LIBRARY_TAU) -> PlackettLuce:
    """The Plackett–Luce model with the library's prior and this β, τ."""
    if not (beta > 0 and tau >= 0 and math.isfinite(beta) and math.isfinite(tau)):
        raise ValueError(f"rating model needs beta > 0 and tau >= 0, got {beta}, {tau}")
    return PlackettLuce(mu=_MODEL.mu, sigma=_MODEL.sigma, beta=beta, tau=tau)


def ordinal(rating: Rating, z: float = ORDINAL_Z) -> float:
    """The LossRating ``μ − z·σ``: a lower confidence bound on the peer's rating."""
    mu, sigma = rating
    return mu - z * sigma


def rate_match(ratings: Mapping[int, Rating], loss_scores: Mapping[int, float], beta: float = LIBRARY_BETA,
               tau: float = LIBRARY_TAU) -> dict[int, Rating]:
    """New ratings of every peer in ``loss_scores`` after one match ranked by LossScore (higher = better).

    Equal LossScores are a draw between those peers; NaN ranks last.  A match
    needs two players: with fewer, ratings are returned unchanged.  Peers are
    entered in uid order so the result does not depend on dict order."""
    uids = sorted(loss_scores)
    current = {uid: bound_rating(ratings.get(uid, initial_rating())) for uid in uids}
    if len(uids) < 2:
        return current
    ranks = competition_ranks({uid: loss_scores[uid] for uid in uids})
    match = model(beta, tau)
    teams = [[match.rating(mu=current[uid][0], sigma=current[uid][1])] for uid in uids]
    new_teams = match.rate(teams, ranks=[float(ranks[uid]) for uid in uids])
    out: dict[int, Rating] = {}
    for uid, team in zip(uids, new_teams, strict=True):
        mu, sigma = float(team[0].mu), float(team[0].sigma)
        # A library result that is not finite would poison every later match: keep the old rating.
        out[uid] = bound_rating((mu, sigma) if math.isfinite(mu) and math.isfinite(sigma) and sigma > 0
                                else current[uid])
    return out


def bound_rating(rating: Rating) -> Rating:
    """``(μ, σ)`` clamped to ``|μ| ≤ RATING_MU_BOUND`` and ``SIGMA_MIN ≤ σ ≤ SIGMA_MAX`` (finite inputs)."""
    mu, sigma = rating
    return (min(RATING_MU_BOUND, max(-RATING_MU_BOUND, mu)), min(SIGMA_MAX, max(SIGMA_MIN, sigma)))
