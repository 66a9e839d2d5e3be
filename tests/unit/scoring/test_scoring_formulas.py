"""Every Gauntlet formula against hand-computed values (and numpy/scipy where they apply)."""
from __future__ import annotations

import itertools
import math
import statistics
import typing

import numpy as np
import pytest
from scipy.stats import rankdata, ttest_ind

from dso.config.schema import HelpRule, HParams
from scoring.formulas import (
    MU_MAX,
    MU_MIN,
    POC_BOUND,
    bound_statistic,
    competition_ranks,
    cooled_down,
    help_median,
    help_ratio,
    last_update_helped,
    loss_delta,
    normalise_weights,
    pay_score,
    peer_score,
    penalise,
    poc_pays,
    poc_statistic,
    poc_update,
    poc_verdict,
    smooth_weights,
    sync_score,
    top_g,
    work_proven,
)
from scoring.help_gate import HELP_GATES, BestOfTwo, MeanOfRecord, help_gate


# ------------------------------------------------------------- proof of computation
def test_poc_statistic_is_welchs_t_as_scipy_computes_it():
    rng = np.random.default_rng(3)
    trained, rand = rng.normal(0.012, 0.01, 32), rng.normal(0.004, 0.013, 24)
    expected = ttest_ind(trained, rand, equal_var=False).statistic
    assert poc_statistic(trained.tolist(), rand.tolist()) == pytest.approx(expected, rel=1e-12)


def test_poc_statistic_hand_value():
    # means 2 and 1, sample variances 1 and 1, n = 3 each: t = 1 / sqrt(1/3 + 1/3)
    assert poc_statistic([1.0, 2.0, 3.0], [0.0, 1.0, 2.0]) == pytest.approx(1 / math.sqrt(2 / 3))


def test_poc_statistic_without_evidence_fails():
    assert poc_statistic([0.1], [0.0, 0.1]) == -math.inf            # one trained sequence: no test
    assert poc_statistic([], [0.0, 0.1]) == -math.inf
    assert poc_statistic([0.1, math.nan], [0.0, 0.1]) == -math.inf  # a step that broke the loss
    assert poc_statistic([0.1, math.inf], [0.0, 0.1]) == -math.inf
    assert poc_statistic([0.0, 0.0], [0.0, 0.0]) == 0.0              # a zero update: no spread, no difference
    assert poc_statistic([0.2, 0.2], [0.1, 0.1]) == math.inf
    assert not poc_verdict(poc_statistic([0.0, 0.0], [0.0, 0.0]), 2.0)
    assert poc_verdict(2.0, 2.0) and not poc_verdict(1.999, 2.0) and not poc_verdict(math.nan, 2.0)


def test_poc_update_is_an_ema_of_verdicts():
    mu = poc_update(0.0, True, 0.95)
    assert mu == pytest.approx(0.05, abs=1e-15)
    mu = poc_update(mu, True, 0.95)                   # 0.95·0.05 + 0.05
    assert mu == pytest.approx(0.0975, abs=1e-15)
    mu = poc_update(mu, False, 0.95)                  # 0.95·0.0975 − 0.05
    assert mu == pytest.approx(0.042625, abs=1e-15)
    assert poc_update(MU_MIN, False, 0.95) == MU_MIN and poc_update(math.nan, False, 0.9) == MU_MIN
    assert poc_update(MU_MAX, True, 0.95) == MU_MAX


@pytest.mark.parametrize("record, proven", [([], False), ([3.7], False), ([3.7, 3.1], True), ([0.4, 3.7, 2.9], True),
                                            ([3.7, 0.75], True), ([3.7, 0.7499], False), ([3.9, -0.5], False),
                                            ([0.9, 0.3, 2.0], False), ([1.5, 1.5], True), ([1.5, 1.4999], False)])
def test_work_is_proven_by_the_mean_of_at_least_two_tests_and_a_last_one_not_failed(record, proven):
    assert work_proven(record, threshold=1.5) is proven


@pytest.mark.parametrize("failed, window, paid", [(-1, 0, True), (5, 15, False), (5, 16, True), (20, 20, False)])
def test_no_pay_within_the_cooldown_of_an_upload_without_work(failed, window, paid):
    assert cooled_down(failed, window, cooldown=10) is paid


def test_the_proof_of_computation_pays_only_proven_cooled_down_work_at_or_above_the_floor():
    assert poc_pays([3.0, 2.0], -1, 12, 0.1, 10, -0.25, 1.5)
    assert not poc_pays([3.0, 2.0], 3, 12, 0.1, 10, -0.25, 1.5)     # a replay 9 windows ago
    assert not poc_pays([3.0, -0.5], -1, 12, 0.1, 10, -0.25, 1.5)   # mean 1.25
    assert not poc_pays([3.0, 2.0], -1, 12, -0.3, 10, -0.25, 1.5)   # penalised below the floor
    assert not poc_pays([3.0, 2.0], -1, 12, math.nan, 10, -0.25, 1.5)


def test_statistics_are_recorded_within_bounds():
    assert bound_statistic(math.inf) == POC_BOUND and bound_statistic(-math.inf) == -POC_BOUND
    assert bound_statistic(math.nan) == -POC_BOUND and bound_statistic(2.5) == 2.5


def test_pay_score_is_declared_work_times_quality():
    assert pay_score([144, 144, 144], 1.0) == 144.0
    assert pay_score([288, 288, 144], 0.75) == pytest.approx(240 * 0.75)
    assert pay_score([], 1.0) == 0.0
    # twice the sequences at the same quality: twice the pay; split over two uids: the same total, no more
    assert pay_score([288, 288], 0.9) == pytest.approx(2 * pay_score([144, 144], 0.9))


@pytest.mark.parametrize("ratios, expected", [([], 0.0), ([1.0, 1.0, 1.0], 1.0), ([0.5, 1.0, 0.9], 0.8),
                                              ([1.0, -1.0, 1.0], 1 / 3), ([-1.0, -1.0], 0.0)])
def test_quality_is_the_help_record_score_in_zero_one(ratios, expected):
    # mean_of_record: the lower of the last two's mean (−1 as 0) and the record's mean (−1 as −1)
    assert MeanOfRecord(0.3).quality(ratios) == pytest.approx(expected)


def test_loss_delta():
    assert loss_delta(3.0, 2.5) == 0.5
    assert loss_delta(3.0, math.inf) == -math.inf        # the step blew the model up: worst possible
    assert loss_delta(3.0, math.nan) == -math.inf
    assert math.isnan(loss_delta(math.nan, 2.0))          # validator's own loss undefined


# ------------------------------------------------------------------ penalty
@pytest.mark.parametrize("mu, expected", [(0.4, 0.3), (0.0, 0.0), (-0.4, -0.5), (1.0, 0.75), (-0.8, -1.0),
                                          (-1.0, -1.0)])
def test_penalise_hand_values(mu, expected):
    assert penalise(mu, 0.75) == pytest.approx(expected, abs=1e-15)


def test_penalise_is_phi_times_mu_for_non_negative_and_never_raises():
    for mu in np.linspace(MU_MIN, MU_MAX, 81):
        out = penalise(float(mu), 0.75)
        assert out <= mu
        if mu >= 0:
            assert out == pytest.approx(0.75 * mu, abs=1e-15)


def test_mu_is_bounded_by_construction_and_an_offline_peer_can_recover():
    """A negative μ was scaled by 1.25 per penalty without bound and reached -inf after ~3,200
    windows (then the saved state was refused and the validator stopped).  Now it stops at MU_MIN, and
    from there ceil(ln 2 / -ln γ) = 14 proofs of computation bring it back above zero (docs/scoring.md)."""
    mu = poc_update(0.0, False, 0.95)               # -0.05
    for _ in range(5000):
        mu = penalise(mu, 0.75)
        assert math.isfinite(mu) and MU_MIN <= mu <= MU_MAX
    assert mu == MU_MIN
    assert penalise(mu, 0.0) == MU_MIN              # a ban's φ = 0 too
    windows = 0
    while mu <= 0:
        mu = poc_update(mu, True, 0.95)
        windows += 1
    assert windows == math.ceil(math.log(2) / -math.log(0.95)) == 14
    for _ in range(5000):
        mu = poc_update(mu, True, 0.95)
    assert mu <= MU_MAX
    assert penalise(math.nan, 0.75) == MU_MIN and poc_update(math.inf, True, 0.9) <= MU_MAX


# ---------------------------------------------------------------- sync score
def test_sync_score_hand_value():
    # |0.1-0.1| + |0.2-0.18| + |-0.3-(-0.36)| = 0.08 over N=3 and α=0.01 → 0.08/0.03 = 2.666…
    assert sync_score([0.1, 0.2, -0.3], [0.1, 0.18, -0.36], 0.01) == pytest.approx(8 / 3)


def test_sync_score_matches_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=64), rng.normal(size=64)
    assert sync_score(a.tolist(), b.tolist(), 2e-3) == pytest.approx(np.abs(a - b).mean() / 2e-3, rel=1e-12)


def test_sync_score_k_steps_behind_scores_k():
    theta = [0.5, -0.25, 1.0, 0.0]
    behind = [t + 3 * 0.002 * s for t, s in zip(theta, (1, -1, 1, -1), strict=True)]
    assert sync_score(theta, behind, 0.002) == pytest.approx(3.0)


def test_sync_score_non_finite_peer_value_fails_and_bad_inputs_raise():
    assert sync_score([0.0, 0.0], [0.0, math.nan], 0.01) == math.inf
    with pytest.raises(ValueError):
        sync_score([0.0], [0.0, 1.0], 0.01)
    with pytest.raises(ValueError):
        sync_score([0.0], [0.0], 0.0)


# ---------------------------------------------------------------- standing
@pytest.mark.parametrize("mu, rating, passed, score", [(0.0, 20.8, True, 20.8), (-0.2, 20.8, True, 20.8),
                                                       (0.0, 20.8, False, 0.0), (-0.3, 20.8, False, -0.3),
                                                       (0.1, 0.0, True, 0.0), (0.1, -3.5, True, -3.5),
                                                       (-0.3, -3.5, False, -3.5)])
def test_standing_is_the_rating_when_the_proof_passes_and_never_positive_when_it_fails(mu, rating, passed, score):
    assert peer_score(mu, rating, passed) == score


def test_two_negatives_never_make_a_reward():
    naive = -0.3 * -18.9
    assert naive > 5                              # what the published formula μ·LossRating pays
    assert peer_score(-0.3, -18.9, False) == -18.9
    weights = normalise_weights({1: peer_score(0.1, 10.0, True), 2: peer_score(-0.3, -18.9, False), 3: 0.0}, 2.0)
    assert weights[2] == 0.0 and weights[1] == 1.0


def test_standing_is_monotone_so_a_penalty_never_raises_it():
    def score(mu: float, rating: float) -> float:
        return peer_score(mu, rating, mu >= -0.25)
    for mu, rating in itertools.product(np.linspace(MU_MIN, MU_MAX, 25), np.linspace(-30, 30, 25)):
        mu, rating = float(mu), float(rating)
        s = score(mu, rating)
        assert score(min(mu + 0.1, MU_MAX), rating) >= s and score(mu, rating + 0.1) >= s
        assert score(penalise(mu, 0.75), rating) <= s


def test_standing_non_finite_gets_no_weight_and_stays_finite():
    assert peer_score(math.nan, 1.0, True) == MU_MIN and peer_score(0.5, math.inf, True) == MU_MIN
    assert peer_score(-0.3, -math.inf, False) == MU_MIN


# ------------------------------------------------------------- normalisation
def test_normalise_hand_values_with_non_positive_peers():
    # clamped (3, 1, 0, 0), min 0, squares (9, 1, 0, 0) / 10
    w = normalise_weights({1: 3.0, 2: 1.0, 3: -2.0, 4: 0.0}, 2.0)
    assert w == pytest.approx({1: 0.9, 2: 0.1, 3: 0.0, 4: 0.0})


def test_normalise_all_positive_shifts_against_zero_so_every_honest_peer_is_paid():
    # shift against the neutral score 0: (2, 3, 4) → squares (4, 9, 16) / 29
    assert normalise_weights({5: 2.0, 6: 3.0, 7: 4.0}, 2.0) == pytest.approx({5: 4 / 29, 6: 9 / 29, 7: 16 / 29})
    # with a non-positive peer present it is exactly the published min-shift
    published = {u: (s - 0.0) ** 2 for u, s in {5: 2.0, 6: 3.0, 7: 4.0, 8: 0.0}.items()}
    total = sum(published.values())
    assert normalise_weights({5: 2.0, 6: 3.0, 7: 4.0, 8: -1.0}, 2.0) == pytest.approx(
        {u: v / total for u, v in published.items()})


def test_normalise_power_one_and_three_against_numpy():
    scores = {1: 0.7, 2: 0.1, 3: 2.5, 4: -1.0, 5: 1.2}
    for c in (1.0, 3.0):
        s = np.maximum(np.array(list(scores.values())), 0)
        expected = (s - s.min()) ** c / ((s - s.min()) ** c).sum()
        got = normalise_weights(scores, c)
        assert [got[u] for u in scores] == pytest.approx(expected.tolist(), rel=1e-12)
        assert math.fsum(got.values()) == pytest.approx(1.0, abs=1e-12)


def test_normalise_nobody_to_pay_gives_all_zeros():
    assert normalise_weights({1: -1.0, 2: 0.0, 3: -5.0}, 2.0) == {1: 0.0, 2: 0.0, 3: 0.0}
    assert normalise_weights({1: 0.4}, 2.0) == {1: 1.0}         # one positive peer takes it all
    assert normalise_weights({1: math.nan, 2: 0.5, 3: 0.0}, 2.0) == {1: 0.0, 2: 1.0, 3: 0.0}
    assert normalise_weights({}, 2.0) == {}


# ------------------------------------------------------------- the help gate
@pytest.mark.parametrize("loss_score, paid", [(0.003, True), (1e-12, True), (None, True), (0.0, False),
                                              (-0.002, False), (-math.inf, False), (math.nan, False)])
def test_only_a_peer_whose_last_update_lowered_the_loss_may_be_paid(loss_score, paid):
    assert last_update_helped(loss_score) is paid


@pytest.mark.parametrize("ratios, paid", [([0.9, 0.2], True),          # exactly the share
                                          ([0.9, 0.1999, 0.05], False),  # the last two below it: cut
                                          ([0.9, -1.0], True),           # one update that did no work: paid
                                          ([0.8, -1.0, 0.9], True),
                                          ([-1.0, 0.9, -1.0], False),    # two of three did no work: cut
                                          ([0.1], False),                # one evaluation: its own ratio
                                          ([-1.0], False),
                                          ([], True)])                   # never evaluated: not held against it
def test_the_help_gate_reads_the_last_two_ratios_and_the_no_work_count(ratios, paid):
    assert BestOfTwo(0.2).helps(ratios) is paid


@pytest.mark.parametrize("ratios, paid", [([-1.0, 0.06, 1.0], False),  # a zoo noise miner's record when the mean
                                          ([0.06, 1.0], True),          # of two paid it; its mean 0.02, here 0.53
                                          ([1.0, 1.0, -1.0], True),     # an honest peer's one bad draw: exactly 1/3
                                          ([0.49, -1.0, 0.73], False),  # ... beside two low ones: 0.073
                                          ([0.3, 0.3, 0.29], False),    # 0.2967
                                          ([0.25, 0.35, 0.3], True),
                                          ([1.0, 0.05, 0.05], False),   # a turncoat's record: mean 0.37, of two 0.05
                                          ([0.3], True), ([0.29], False), ([-1.0], False),
                                          ([-1.0, 1.0, -1.0], False),   # two of three did no work
                                          ([], True)])
def test_the_mean_of_the_record_counts_no_work_against_a_lucky_draw(ratios, paid):
    assert MeanOfRecord(0.3).helps(ratios) is paid


def test_the_run_picks_its_help_gate_by_name_and_refuses_an_unknown_one():
    hp = HParams()
    assert isinstance(help_gate(hp), MeanOfRecord) and help_gate(hp).share == hp.help_share  # the default
    hp.help_rule, hp.help_share = "best_of_two", 0.2
    assert isinstance(help_gate(hp), BestOfTwo) and help_gate(hp).share == 0.2
    assert set(HELP_GATES) == set(typing.get_args(HelpRule))  # the config's choices
    hp.help_rule = "mean"  # type: ignore[assignment]
    with pytest.raises(ValueError, match="help rule must be one of best_of_two, mean_of_record, got 'mean'"):
        help_gate(hp)


@pytest.mark.parametrize("loss_score, median, ratio", [(0.004, 0.008, 0.5), (0.02, 0.008, 1.0), (0.0, 0.008, -1.0),
                                                       (-0.004, 0.008, -1.0), (-0.1, 0.008, -1.0),
                                                       (0.003, -0.002, 1.0), (0.003, None, 1.0),
                                                       (-0.003, None, -1.0), (math.nan, 0.008, -1.0),
                                                       (0.003, math.nan, 1.0), (-math.inf, 0.008, -1.0)])
def test_help_ratio_hand_values(loss_score, median, ratio):
    assert help_ratio(loss_score, median) == ratio


@pytest.mark.parametrize("gate", [BestOfTwo(0.2), MeanOfRecord(0.2)], ids=lambda g: g.name)
def test_an_honest_peer_survives_one_low_draw_and_a_turncoat_is_cut_at_its_second_bad_evaluation(gate):
    low = help_ratio(-0.0001, 0.004)                          # late in a run: an honest LossScore ≤ 0
    assert low == -1.0 and gate.helps([0.9, 1.0, low])
    assert not gate.helps([1.0, low, help_ratio(0.0006, 0.004)])   # then 0.15 × the median: cut
    noise = help_ratio(0.0002, 0.004)                         # noise scoring 0.05 × the median by chance
    assert noise == pytest.approx(0.05)
    assert gate.helps([1.0, 1.0, noise]) and not gate.helps([1.0, noise, noise])
    # noise that scores above the share once is still cut if it did no work in two of three evaluations
    assert not gate.helps([help_ratio(-1e-4, 0.004), help_ratio(-1e-5, 0.004), 0.3])


# ------------------------------------------------------------- smoothing
def test_smooth_weights_hand_values():
    # 0.5·(0.2, 0.8) + 0.5·(0.5, 0.5) = (0.35, 0.65): sums to 1, nothing to renormalise
    assert smooth_weights({1: 0.5, 2: 0.5}, {1: 0.2, 2: 0.8}, 0.5) == pytest.approx({1: 0.35, 2: 0.65})
    # a newcomer has no history: 0.25·(0.5, 0.5) + 0.75·(1, 0) = (0.875, 0.125)
    assert smooth_weights({1: 1.0}, {1: 0.5, 2: 0.5}, 0.25) == pytest.approx({1: 0.875, 2: 0.125})
    assert smooth_weights({}, {1: 0.3, 2: 0.7}, 0.4) == pytest.approx({1: 0.3, 2: 0.7})


def test_smooth_weights_drops_an_unpaid_peer_at_once_and_renormalises():
    # peer 3 is not paid this window: 0 at once, not 0.5·0.2; (0.55, 0.35) / 0.9
    got = smooth_weights({1: 0.5, 2: 0.3, 3: 0.2}, {1: 0.6, 2: 0.4, 3: 0.0}, 0.5)
    assert got == pytest.approx({1: 0.55 / 0.9, 2: 0.35 / 0.9, 3: 0.0})
    assert got[3] == 0.0 and math.fsum(got.values()) == pytest.approx(1.0, abs=1e-15)
    assert smooth_weights({1: 0.5}, {1: 0.0, 2: 0.0}, 0.5) == {1: 0.0, 2: 0.0}   # nobody paid: nothing posted
    assert 9 not in smooth_weights({9: 1.0}, {1: 1.0}, 0.5)                      # a peer that left is not posted


def test_smooth_weights_is_a_geometric_approach_and_rate_one_is_no_smoothing():
    w = {1: 1.0, 2: 0.0}
    for expected in ((0.75, 0.25), (0.625, 0.375), (0.5625, 0.4375)):   # 0.5 + 0.5^n · 0.5
        w = smooth_weights(w, {1: 0.5, 2: 0.5}, 0.5)
        assert (w[1], w[2]) == pytest.approx(expected, abs=1e-15)
    assert smooth_weights({1: 0.9, 2: 0.1}, {1: 0.25, 2: 0.75}, 1.0) == {1: 0.25, 2: 0.75}
    for bad in (0.0, -0.1, 1.5, math.nan):
        with pytest.raises(ValueError):
            smooth_weights({}, {1: 1.0}, bad)


def test_smooth_weights_ignores_damaged_history():
    # a NaN or out-of-range previous weight counts as 0 / 1, never poisons the row
    got = smooth_weights({1: math.nan, 2: 7.0}, {1: 0.5, 2: 0.5}, 0.5)
    assert got == pytest.approx({1: 0.25 / 1.0, 2: 0.75 / 1.0})


# ------------------------------------------------------------------- top-G
def test_top_g_ties_go_to_lower_uid_and_only_positive_scores():
    scores = {5: 1.0, 3: 1.0, 7: 2.0, 9: 0.0, 1: -1.0, 4: 1.0}
    assert top_g(scores, 2) == [7, 3]
    assert top_g(scores, 3) == [7, 3, 4]
    assert top_g(scores, 10) == [7, 3, 4, 5]      # 9 (zero) and 1 (negative) never qualify
    assert top_g({1: 0.0, 2: -3.0}, 15) == []


# ------------------------------------------------------------------- ranks
def test_competition_ranks_match_scipy_min_ranking():
    values = {10: 0.3, 11: -0.1, 12: 0.3, 13: 0.05, 14: math.nan, 15: -math.inf}
    ranks = competition_ranks(values)
    finite = [v if v == v else -math.inf for v in values.values()]
    expected = rankdata([-v for v in finite], method="min") - 1
    assert [ranks[u] for u in values] == expected.tolist()
    assert ranks[10] == ranks[12] == 0 and ranks[13] == 2


def test_the_help_median_leaves_out_updates_that_did_no_work():
    """A default make run's window 9: four honest LossScores, a free-rider's 0 and a noise update's 0.0012.  With
    the no-work updates counted the median is 0.00555 and the noise passes the help gate (0.216 ≥ 0.2); without
    them it is 0.0083 and the noise does not (0.145).  The share is that run's (0.2, the DCT codec's gate)."""
    share = 0.2
    window = [0.0131, 0.0083, 0.0095, 0.0028, 0.0, 0.0012]
    assert statistics.median(window) == pytest.approx(0.00555)
    assert help_ratio(0.0012, statistics.median(window)) >= share
    assert help_median(window) == pytest.approx(0.0083)
    assert help_ratio(0.0012, help_median(window)) == pytest.approx(0.0012 / 0.0083)
    assert help_ratio(0.0012, help_median(window)) < share
    assert help_median([0.0, -0.01, float("nan")]) is None
    assert help_median([float("inf"), 0.2, 0.4]) == pytest.approx(0.3)
