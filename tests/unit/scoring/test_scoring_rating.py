"""LossRating: the OpenSkill match is fed the right order (checked against Weng & Lin's formulas)."""
from __future__ import annotations

import math

import pytest

from scoring.rating import (
    RATING_MU_BOUND,
    SIGMA_MAX,
    SIGMA_MIN,
    bound_rating,
    initial_rating,
    model,
    ordinal,
    rate_match,
)

BETA, TAU, KAPPA = 25 / 6, 25 / 300, 1e-4


def plackett_luce_oracle(ratings: list[tuple[float, float]], ranks: list[int], beta: float = BETA,
                         tau: float = TAU) -> list[tuple[float, float]]:
    """Weng & Lin (2011) Algorithm 4, one player per team, distinct ranks, after the τ dynamics step."""
    var = [s * s + tau * tau for _, s in ratings]
    c = math.sqrt(sum(v + beta * beta for v in var))
    e = [math.exp(mu / c) for mu, _ in ratings]
    n = len(ratings)
    sum_q = [sum(e[i] for i in range(n) if ranks[i] >= ranks[q]) for q in range(n)]
    out = []
    for i in range(n):
        omega = delta = 0.0
        for q in range(n):
            if ranks[q] <= ranks[i]:
                p = e[i] / sum_q[q]
                omega += (1 - p) if q == i else -p
                delta += p * (1 - p)
        gamma = math.sqrt(var[i]) / c
        mu = ratings[i][0] + var[i] / c * omega
        sigma = math.sqrt(var[i] * max(1 - gamma * var[i] / c ** 2 * delta, KAPPA))
        out.append((mu, sigma))
    return out


def test_fresh_peer_has_zero_loss_rating():
    assert initial_rating() == pytest.approx((25.0, 25 / 3))
    assert ordinal(initial_rating()) == pytest.approx(0.0, abs=1e-12)


def test_match_matches_weng_lin_oracle():
    before = {4: (25.0, 25 / 3), 9: (27.0, 6.0), 2: (22.0, 7.5)}
    scores = {4: 0.02, 9: -0.01, 2: 0.05}          # best: uid 2, then 4, then 9
    after = rate_match(before, scores)
    uids = [2, 4, 9]
    expected = plackett_luce_oracle([before[u] for u in uids], [0, 1, 2])
    for uid, (mu, sigma) in zip(uids, expected, strict=True):
        assert after[uid][0] == pytest.approx(mu, rel=1e-12)
        assert after[uid][1] == pytest.approx(sigma, rel=1e-12)
    assert after[2][0] > before[2][0] and after[9][0] < before[9][0]


@pytest.mark.parametrize("beta, tau", [(7.0, 0.1), (4.0, 1.0)])
def test_match_with_other_beta_and_tau_matches_the_oracle(beta, tau):
    before = {4: (25.0, 25 / 3), 9: (27.0, 6.0), 2: (22.0, 7.5)}
    after = rate_match(before, {4: 0.02, 9: -0.01, 2: 0.05}, beta, tau)
    expected = plackett_luce_oracle([before[u] for u in (2, 4, 9)], [0, 1, 2], beta, tau)
    for uid, (mu, sigma) in zip([2, 4, 9], expected, strict=True):
        assert after[uid] == pytest.approx((mu, sigma), rel=1e-12)
    assert after != rate_match(before, {4: 0.02, 9: -0.01, 2: 0.05})   # the parameters are used
    with pytest.raises(ValueError):
        model(0.0, 0.1)


def test_ordinal_takes_z():
    assert ordinal((25.0, 5.0)) == 10.0 and ordinal((25.0, 5.0), 1.0) == 20.0 and ordinal((25.0, 5.0), 0.0) == 25.0


def test_winner_rating_rises_loser_falls_from_fresh():
    after = rate_match({}, {1: 0.3, 2: 0.1, 3: -0.2, 4: 0.0})
    ratings = {uid: ordinal(r) for uid, r in after.items()}
    assert ratings[1] > ratings[2] > ratings[4] > ratings[3]
    assert ratings[1] > 0 > ratings[3]


def test_equal_loss_scores_are_a_draw():
    after = rate_match({}, {1: 0.0, 2: 0.0, 3: 0.0})
    assert after[1] == after[2] == after[3]
    assert after[1][0] == pytest.approx(25.0)        # means do not move in a draw
    assert after[1][1] < 25 / 3                      # but the rating grows more certain


def test_nan_loss_score_ranks_last():
    after = rate_match({}, {1: math.nan, 2: -5.0})
    assert ordinal(after[2]) > ordinal(after[1])


def test_fewer_than_two_players_leaves_ratings_unchanged_and_inputs_are_not_mutated():
    start = {7: (30.0, 4.0)}
    assert rate_match(start, {7: 0.5}) == {7: (30.0, 4.0)}
    assert rate_match(start, {}) == {}
    both = {7: (30.0, 4.0), 8: (20.0, 5.0)}
    rate_match(both, {7: 0.1, 8: 0.2})
    assert both == {7: (30.0, 4.0), 8: (20.0, 5.0)}


def test_result_does_not_depend_on_dict_order():
    a = rate_match({1: (26.0, 7.0), 2: (24.0, 8.0)}, {2: 0.4, 1: 0.1, 3: 0.2})
    b = rate_match({2: (24.0, 8.0), 1: (26.0, 7.0)}, {3: 0.2, 1: 0.1, 2: 0.4})
    assert a == b


def test_ratings_stay_within_their_bounds():
    """Every stored rating is finite and bounded, whatever comes in (docs/scoring.md, "Bounds")."""
    assert bound_rating((5e3, 1e-9)) == (RATING_MU_BOUND, SIGMA_MIN)
    assert bound_rating((-5e3, 1e3)) == (-RATING_MU_BOUND, SIGMA_MAX)
    ratings = {1: (RATING_MU_BOUND, SIGMA_MIN), 2: (-RATING_MU_BOUND, SIGMA_MIN)}
    for _ in range(200):  # the leader keeps winning at the bound, the last keeps losing
        ratings = rate_match(ratings, {1: 1.0, 2: -1.0})
    for mu, sigma in ratings.values():
        assert abs(mu) <= RATING_MU_BOUND and SIGMA_MIN <= sigma <= SIGMA_MAX
