"""Rényi-DP of a miner's clipped and noised updates: the formulas, free of torch (the config solves z with them).

Each round a miner releases ``clip_C(x) + N(0, (z·C)² I)``.  Two neighbouring inputs — the same miner on
two different data sets for the round ("replace one") — give clipped updates that can point in opposite
directions, so they differ by up to **2C** in L2: the Gaussian mechanism's sensitivity is 2C, and with noise
std z·C one round has ``RDP(α) = α·(2C)² / (2·(zC)²) = 2α / z²`` (Mironov 2017).  (Counting C instead
would be right only for add/remove neighbours, where the miner's contribution is absent from one of the two
worlds; here the miner uploads in both, so a reader always compares two clipped updates.)  Rounds compose
by adding RDP per order, adaptively: a round may depend on earlier releases.  RDP → (ε, δ) by Balle et al.
2020: ``ε = min_α [RDP(α) + log1p(−1/α) − (ln δ + ln α)/(α − 1)]``.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

REPLACE_ONE = 2.0  # sensitivity in units of the clip norm C (docs/extensions.md §3)


def gaussian_rdp(orders: Iterable[float], noise_multiplier: float, sensitivity: float = REPLACE_ONE) -> list[float]:
    """RDP per order of one Gaussian-mechanism round: noise std ``noise_multiplier`` and L2 sensitivity
    ``sensitivity``, both in units of the clip norm."""
    ratio = sensitivity / noise_multiplier
    return [float(a) * ratio * ratio / 2.0 for a in orders]


def rdp_to_epsilon(rdp: Iterable[float], orders: Iterable[float], delta: float) -> tuple[float, float | None]:
    """(ε, optimal order) by the conversion of Balle et al. 2020; (0, None) when nothing was spent."""
    rdp, orders = list(rdp), list(orders)
    if all(r == 0 for r in rdp):
        return 0.0, None
    best, best_order = math.inf, None
    for r, a in zip(rdp, orders, strict=True):
        eps = r + math.log1p(-1.0 / a) - (math.log(delta) + math.log(a)) / (a - 1.0)
        if eps < best:
            best, best_order = eps, a
    return max(best, 0.0), best_order


def epsilon_of(noise_multiplier: float, rounds: int, delta: float, orders: Iterable[float]) -> float:
    """ε after ``rounds`` rounds at noise multiplier z (replace-one sensitivity)."""
    orders = list(orders)
    per_round = gaussian_rdp(orders, noise_multiplier)
    return rdp_to_epsilon([rounds * r for r in per_round], orders, delta)[0]


def noise_for_target(epsilon: float, delta: float, rounds: int, orders: Iterable[float]) -> float:
    """The smallest noise multiplier z (to 1e-9 relative) with which ``rounds`` rounds spend at most ``epsilon``.

    ε is decreasing in z, so bisection; the answer is on the safe side of the target."""
    if not (epsilon > 0 and math.isfinite(epsilon)) or rounds < 1 or not 0 < delta < 1:
        raise ValueError(f"target needs epsilon > 0, rounds >= 1, 0 < delta < 1 (got {epsilon}, {rounds}, {delta})")
    orders = list(orders)
    lo, hi = 1e-3, 1.0
    while epsilon_of(hi, rounds, delta, orders) > epsilon:
        lo, hi = hi, hi * 2.0
        if hi > 1e9:
            raise ValueError(f"no noise multiplier reaches ε={epsilon} at δ={delta} over {rounds} rounds")
    while hi - lo > 1e-9 * hi:
        mid = (lo + hi) / 2.0
        if epsilon_of(mid, rounds, delta, orders) > epsilon:
            lo = mid
        else:
            hi = mid
    return hi
