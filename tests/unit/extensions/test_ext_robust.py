"""Robust aggregation rules: known values, independent oracles, and Byzantine attacks."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import optimize, stats

import dso.aggregation.robust as robust
from dso.aggregation.robust import (
    RULES,
    coherence_filter,
    coordinate_median,
    decoded_rows,
    drop_non_finite,
    finite_rows,
    geometric_median,
    gram,
    multi_krum,
    pairwise_sq_distances,
    robust_aggregate,
    robust_delta,
    split_vector,
    trim_count,
    trimmed_mean,
)
from dso.codec.demo import DeMoCodec
from dso.config.schema import HParams
from dso.protocol.rejections import Reason
from sim import attacks
from sim.attacks import ATTACKS, byzantine_rows

torch.set_num_threads(1)


def t64(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def scipy_geomedian(X: np.ndarray) -> np.ndarray:
    res = optimize.minimize(lambda z: np.linalg.norm(X - z, axis=1).sum(), X.mean(axis=0), method="Nelder-Mead",
                            options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 20000, "maxfev": 40000})
    return res.x


# ------------------------------------------------------ geometric median
def test_geomedian_fermat_point_of_right_triangle():
    z, iters = geometric_median(t64([[0, 0], [1, 0], [0, 1]]))
    exact = (3 - math.sqrt(3)) / 6  # 0.211325: all three angles at z are 120°
    assert z.tolist() == pytest.approx([exact, exact], abs=1e-7)
    assert z.tolist() == pytest.approx([0.211325, 0.211325], abs=1e-6)
    assert np.allclose(z.numpy(), scipy_geomedian(np.array([[0, 0], [1, 0], [0, 1]], float)), atol=1e-6)
    assert iters > 1


def test_geomedian_resists_one_far_outlier():
    X = [[0, 0], [1, 0], [0, 1], [1, 1], [1e6, 1e6]]
    z, _ = geometric_median(t64(X))
    exact = (3 + math.sqrt(3)) / 6  # 0.788675: the outlier's unit pull balances the four corners
    assert z.tolist() == pytest.approx([exact, exact], abs=1e-6)
    assert z.tolist() == pytest.approx([0.7887, 0.7887], abs=1e-4)
    # float32 input gives the same answer (distances come from a float64 Gram matrix)
    z32, _ = geometric_median(torch.tensor(X, dtype=torch.float32))
    assert z32.dtype == torch.float32 and z32.tolist() == pytest.approx([exact, exact], abs=1e-5)


def test_geomedian_matches_scipy_in_higher_dimension():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(9, 6))
    z, _ = geometric_median(torch.from_numpy(X))
    oracle = scipy_geomedian(X)
    f = lambda p: np.linalg.norm(X - p, axis=1).sum()  # noqa: E731
    assert f(z.numpy()) <= f(oracle) + 1e-9
    assert np.allclose(z.numpy(), oracle, atol=1e-4)


def test_geomedian_of_identical_rows_and_of_a_data_point():
    X = t64([[2.0, -1.0]] * 4)
    z, _ = geometric_median(X)
    assert z.tolist() == [2.0, -1.0]
    # a majority at one point: the median is that point (ν keeps the weights finite there)
    z, _ = geometric_median(t64([[0, 0], [0, 0], [0, 0], [5, 1], [-3, 7]]))
    assert z.tolist() == pytest.approx([0.0, 0.0], abs=1e-5)


# ---------------------------------------------------- coordinate rules
def test_trimmed_mean_known_value_and_scipy():
    x = t64([0, 1, 2, 3, 4, 5, 6, 7, 8, 1000]).reshape(-1, 1)
    assert trimmed_mean(x, 0.1).item() == pytest.approx(4.5)
    assert stats.trim_mean(x.numpy()[:, 0], 0.1) == pytest.approx(4.5)
    rng = np.random.default_rng(0)
    for n, beta in [(10, 0.1), (25, 0.2), (7, 0.3), (12, 0.0), (40, 0.45)]:
        X = rng.standard_cauchy(size=(n, 33))
        ours = trimmed_mean(torch.from_numpy(X), beta).numpy()
        assert np.allclose(ours, stats.trim_mean(X, beta, axis=0), rtol=1e-12, atol=1e-12), (n, beta)


def test_trim_count_is_floor_of_beta_n():
    assert trim_count(10, 0.1) == 1 and trim_count(25, 0.1) == 2 and trim_count(25, 0.2) == 5
    assert trim_count(100, 0.29) == 29  # 0.29 * 100 = 28.999… in floating point
    with pytest.raises(ValueError):
        trim_count(10, 0.5)


@pytest.mark.parametrize("n", [1, 2, 5, 6])
def test_coordinate_median_matches_numpy(n, monkeypatch):
    monkeypatch.setattr(robust, "COLUMN_BLOCK", 7)  # exercise the block loop
    X = np.random.default_rng(n).normal(size=(n, 50))
    assert np.allclose(coordinate_median(torch.from_numpy(X)).numpy(), np.median(X, axis=0), atol=0)


# ----------------------------------------------------------- Multi-Krum
def brute_krum_scores(X: np.ndarray, f: int) -> np.ndarray:
    n = len(X)
    scores = []
    for i in range(n):
        d = sorted(float(((X[i] - X[j]) ** 2).sum()) for j in range(n) if j != i)
        scores.append(sum(d[: n - f - 2]))
    return np.array(scores)


def test_multi_krum_hand_computed():
    # 1-D points 0, 1, 2, 3, 100 with f=1: each score sums the 2 nearest squared distances
    X = t64([[0], [1], [2], [3], [100]])
    # scores: 0→1+4=5, 1→1+1=2, 2→1+1=2, 3→1+4=5, 100→97²+98²; m = n − f = 4 best → rows 0..3
    out, sel = multi_krum(X, f=1)
    assert sel == [0, 1, 2, 3] and out.item() == pytest.approx(1.5)
    out, sel = multi_krum(X, f=1, m=2)
    assert sel == [1, 2] and out.item() == pytest.approx(1.5)
    out, sel = multi_krum(X, f=1, m=1)  # tie between rows 1 and 2 → lower row
    assert sel == [1] and out.item() == 1.0


def test_multi_krum_matches_brute_force_and_excludes_self():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(12, 20))
    X[3] = X[5]  # twins: distance 0 to each other counts; distance 0 to itself must not
    for f in (1, 3, 4):
        scores = brute_krum_scores(X, f)
        _, sel = multi_krum(torch.from_numpy(X), f, m=5)
        assert sel == sorted(np.argsort(scores, kind="stable")[:5].tolist())
        out, sel = multi_krum(torch.from_numpy(X), f, m=5)
        assert np.allclose(out.numpy(), X[sel].mean(axis=0))  # plain, unweighted mean


def test_pairwise_distances_never_negative_under_cancellation():
    base = torch.full((1, 1000), 1e4, dtype=torch.float32)
    X = base + torch.randn(6, 1000, generator=torch.Generator().manual_seed(0)) * 1e-3
    X[2] = X[1]
    d2 = pairwise_sq_distances(gram(X))
    assert bool((d2 >= 0).all()) and float(d2[1, 2]) == 0.0


# -------------------------------------------------- filtering / dispatch
def test_non_finite_rows_are_dropped_and_reported():
    X = t64([[1, 2], [math.nan, 0], [3, 4], [0, math.inf]])
    assert finite_rows(X).tolist() == [True, False, True, False]
    kept_X, kept, dropped = drop_non_finite(X, ids=[10, 11, 12, 13])
    assert kept == [10, 12] and set(dropped) == {11, 13}
    assert all(r.reason is Reason.NON_FINITE for r in dropped.values())
    for rule in RULES:
        out, info = robust_aggregate(rule, X, HParams(), ids=[10, 11, 12, 13])
        assert bool(torch.isfinite(out).all()) and info.kept == [10, 12] and set(info.dropped) == {11, 13}


def test_all_rows_non_finite_gives_zero_step_not_an_exception():
    out, info = robust_aggregate("geomedian", torch.full((3, 4), math.nan), HParams())
    assert out.tolist() == [0.0] * 4 and info.kept == [] and len(info.dropped) == 3


def test_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="unknown aggregation rule"):
        robust_aggregate("bogus", torch.zeros(2, 2), HParams())


def test_coherence_gate():
    X = t64([[1, 0], [1, 1], [0, 1], [-1, 0], [0, 0]])
    consensus = t64([1, 0])
    # cosines: 1, 0.7071, 0, -1, 0 (zero row)
    assert coherence_filter(X, consensus, 0.5).tolist() == [True, True, False, False, False]
    assert coherence_filter(X, consensus, -1).all()  # -1 = off
    assert coherence_filter(X, t64([0, 0]), 0.9).all()  # no consensus direction → keep all
    hp = HParams()
    hp.coherence_threshold = 0.5
    out, info = robust_aggregate("mean", X, hp, consensus=consensus)
    assert info.kept == [0, 1] and info.incoherent == pytest.approx({2: 0.0, 3: -1.0, 4: 0.0})
    assert out.tolist() == pytest.approx([1.0, 0.5])


def test_robust_delta_mean_is_the_gauntlet_mean_and_rules_agree_on_identical_updates():
    shapes = {"a": (16, 32), "b": (40,)}
    codec = DeMoCodec(shapes, chunk=16, topk=8, value_bits=4)
    gen = torch.Generator().manual_seed(1)
    grads = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
    updates = [codec.compress(grads, 0)] * 3
    hp = HParams()
    exact, info = robust_delta(codec, updates, hp, ids=[4, 8, 9])
    reference = codec.mean_delta(updates)
    assert all(torch.equal(exact[n], reference[n]) for n in shapes) and info.kept == [4, 8, 9]
    for rule in ("median", "trimmed_mean", "geomedian", "krum"):
        hp.aggregation = rule
        delta, info = robust_delta(codec, updates, hp)
        for n in shapes:
            assert torch.allclose(delta[n], reference[n], atol=1e-6), (rule, n)
    rows = decoded_rows(codec, updates)
    assert rows.shape == (3, 16 * 32 + 40)
    assert torch.equal(split_vector(rows[0], shapes)["b"], rows[0][-40:])


# --------------------------------------------------------------- attacks
HONEST, BYZANTINE, DIM = 20, 5, 2000


def attack_cosines(trim_beta: float) -> dict[tuple[str, str], float]:
    gen = torch.Generator().manual_seed(0)
    truth = torch.randn(DIM, generator=gen, dtype=torch.float64)
    honest = truth + torch.randn(HONEST, DIM, generator=gen, dtype=torch.float64)  # per-peer cos to truth ≈ 0.7
    honest_mean = honest.mean(dim=0)
    hp = HParams()
    hp.krum_f, hp.trim_beta = BYZANTINE, trim_beta
    out = {}
    for attack in ATTACKS:
        X = torch.cat([honest, byzantine_rows(honest, attack, BYZANTINE, gen)])
        for rule in RULES:
            agg, _ = robust_aggregate(rule, X, hp)
            out[rule, attack] = float(agg @ honest_mean / (agg.norm() * honest_mean.norm()))
    return out


def print_table(title: str, cos: dict) -> None:
    print(f"\n{title}: cosine of the aggregate to the honest mean ({HONEST} honest + {BYZANTINE} Byzantine)")
    print("rule          " + " ".join(f"{a:>10}" for a in ATTACKS))
    for rule in RULES:
        print(f"{rule:<13} " + " ".join(f"{cos[rule, a]:10.3f}" for a in ATTACKS))


def test_attacks_robust_rules_hold_where_theory_says():
    cos = attack_cosines(trim_beta=0.2)  # trimmed mean's condition: β ≥ f/n = 0.2
    print_table("trim β = 0.2", cos)
    # every robust rule's condition holds here: n = 25 ≥ 2f + 3 (Krum), f < n/2 (medians), β ≥ f/n
    for rule in ("krum", "median", "trimmed_mean", "geomedian"):
        for attack in ATTACKS:
            assert cos[rule, attack] > 0.9, (rule, attack, cos[rule, attack])
    # the plain mean has no guarantee: the scaled attack breaks it; non-finite rows are dropped first
    assert cos["mean", "scaling"] < 0.5
    assert cos["mean", "infinite"] == pytest.approx(1.0, abs=1e-12)


def test_attacks_trimmed_mean_breaks_when_beta_is_below_f_over_n():
    cos = attack_cosines(trim_beta=0.1)  # trims 2 per side while 5 peers attack
    print_table("trim β = 0.1", cos)
    assert cos["trimmed_mean", "scaling"] < 0.5
    assert cos["trimmed_mean", "infinite"] > 0.99


def test_alie_z_matches_scipy():
    n, f = 25, 5
    s = math.floor(n / 2 + 1) - f
    assert attacks.alie_z(n, f) == pytest.approx(stats.norm.ppf((n - s) / n), abs=1e-9)
