"""Gauntlet formulas as pure functions of plain numbers (design §6, docs/scoring.md).

Nothing here touches a model, a file or a clock, so every formula is unit-tested
with hand-computed values.  Inputs that may come from another party (losses of a
peer's update, its sync samples) can be NaN or infinite: each function says what
such a value means, and none of them raises on it.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence


def sign(x: float) -> float:
    """-1, 0 or +1 (NaN → 0: no evidence either way)."""
    return 1.0 if x > 0 else (-1.0 if x < 0 else 0.0)


def loss_delta(loss_before: float, loss_after: float) -> float:
    """δ = L(θ) − L(θ'): positive when the peer's step lowers the loss.

    A step that makes the loss non-finite is the worst possible outcome (−inf);
    a non-finite loss *before* the step is the validator's own problem and gives NaN."""
    if not math.isfinite(loss_before):
        return math.nan
    if not math.isfinite(loss_after):
        return -math.inf
    return loss_before - loss_after


# μ lives in [MU_MIN, MU_MAX] by construction (docs/scoring.md, "Bounds"): the PoC update is a convex
# combination of μ and a step in [−1, 1], and penalties stop at MU_MIN.  Unbounded, a penalised negative μ
# grew by (2 − φ) per window and reached −inf after ~3,200 windows, which made the saved state unloadable.
MU_MIN, MU_MAX = -1.0, 1.0


def bound_mu(mu: float) -> float:
    """μ clamped to [MU_MIN, MU_MAX]; NaN (no evidence of anything good) is MU_MIN."""
    if mu != mu:
        return MU_MIN
    return min(MU_MAX, max(MU_MIN, mu))


def poc_update(mu: float, passed: bool, gamma: float) -> float:
    """μ, the record of proof-of-computation verdicts: ``μ ← γ·μ + (1−γ)·(+1 if passed else −1)``, within
    [MU_MIN, MU_MAX].  Fast-check penalties lower the same μ (``penalise``)."""
    return bound_mu(gamma * bound_mu(mu) + (1.0 - gamma) * (1.0 if passed else -1.0))


def penalise(mu: float, phi: float) -> float:
    """The fast-check penalty, ``max(MU_MIN, μ − (1−φ)·|μ|)``: equals ``φ·μ`` for μ ≥ 0 and never raises μ.

    (Multiplying a negative μ by φ < 1 would move it up, towards zero.)  A negative μ is scaled by
    ``2 − φ`` per penalty until it reaches MU_MIN, where it stays until proofs of computation lift it."""
    mu = bound_mu(mu)
    return max(MU_MIN, mu - (1.0 - phi) * abs(mu))


def sync_score(validator_values: list[float], peer_values: list[float], lr: float) -> float:
    """``(1/(α·N)) Σ |θ_i(validator) − θ_i(peer)|``: how many signed steps of size α apart.

    A non-finite peer value makes the score +inf (it can only fail)."""
    if len(validator_values) != len(peer_values) or not validator_values:
        raise ValueError("sync_score needs two non-empty sample lists of equal length")
    if lr <= 0:
        raise ValueError(f"learning rate must be > 0, got {lr}")
    total = 0.0
    for mine, theirs in zip(validator_values, peer_values, strict=True):
        if not math.isfinite(theirs):
            return math.inf
        total += abs(mine - theirs)
    return total / (lr * len(validator_values))


def poc_statistic(assigned_gains: Sequence[float], rand_gains: Sequence[float]) -> float:
    """Proof of computation: Welch's t of a peer's per-sequence loss gains ``L(θ_t, x) − L(θ'_p, x)`` on sequences it
    declared it trained on (``assigned_gains``) against the gains on random sequences (``rand_gains``).

    An update trained on those sequences lowers their loss more than it lowers the loss of others (a step on a
    batch helps that batch most); an update trained on other data, replayed from another window, or mixed from
    other peers' updates helps both alike, so its t is around 0 (docs/scoring.md, "Proof of computation").  Fewer
    than two gains on either side, or any that is not a finite number (a step that broke the loss), is no
    evidence: −inf.  Equal gains throughout (zero spread) give ±inf by the sign of the difference, or 0."""
    a, r = list(assigned_gains), list(rand_gains)
    if len(a) < 2 or len(r) < 2 or not all(math.isfinite(x) for x in a + r):
        return -math.inf
    diff = statistics.fmean(a) - statistics.fmean(r)
    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(r) / len(r))
    if se > 0:
        return diff / se
    return math.copysign(math.inf, diff) if diff else 0.0


def poc_verdict(statistic: float, threshold: float) -> bool:
    """Whether one proof-of-computation test passes: its statistic (``poc_statistic``) is at least ``threshold``
    (NaN fails)."""
    return statistic >= threshold


POC_BOUND = 10.0  # a statistic is recorded within ±this: one extreme draw cannot carry a record


def bound_statistic(statistic: float) -> float:
    """A test statistic as the record keeps it: within ±POC_BOUND, NaN as −POC_BOUND (no evidence)."""
    return -POC_BOUND if statistic != statistic else min(POC_BOUND, max(-POC_BOUND, statistic))


PROVEN_AFTER = 2  # evaluations in a peer's record before its proof of computation can pay (``work_proven``)


def work_proven(statistics_: Sequence[float], threshold: float) -> bool:
    """Whether a peer's record of proof-of-computation statistics (``PeerState.poc_record``, oldest first) proves it
    trains on the sequences it declares: at least ``PROVEN_AFTER`` of them, with a mean at or above ``threshold``, and
    the last at or above half of it.

    The mean of a few tests, not each one: an honest update's statistic is around 3–4 on the default model (2.5 for
    twice the sequences per window), one that took no work on its data around 0, and one test in a few of an honest
    peer falls low by chance, where the mean of its record does not; a miner that trains on other data, or mixes
    other miners' updates, sits at 0 in every test.  The last test on its own: a strong test beside a failed one
    can lift a short record's mean, as a miner that worked in one of its two evaluated windows would have it
    (docs/scoring.md, "Proof of computation")."""
    return (len(statistics_) >= PROVEN_AFTER and statistics.fmean(statistics_) >= threshold
            and statistics_[-1] >= threshold / 2)


def cooled_down(failed_window: int, window: int, cooldown: int) -> bool:
    """Whether ``cooldown`` windows have passed since a peer last uploaded something that certainly took no work
    (``failed_window``, −1 = never: a replay, an empty update — scoring/history.py): a part-time miner sends those in
    the windows it does not train, and is not paid for ``cooldown`` windows after each."""
    return failed_window < 0 or window - failed_window > cooldown


def poc_pays(statistics_: Sequence[float], failed_window: int, window: int, mu: float, cooldown: int, floor: float,
             threshold: float) -> bool:
    """The proof-of-computation side of the pay rule: proven work (``work_proven``), no upload without work within
    the cooldown (``cooled_down``), and μ — the EMA of verdicts, lowered by fast-check penalties — at or above
    ``floor`` (NaN fails)."""
    return work_proven(statistics_, threshold) and cooled_down(failed_window, window, cooldown) and mu >= floor


def pay_score(work: Sequence[int], quality_: float) -> float:
    """What a peer that passes every gate is paid for, before normalisation: its work per evaluation (the mean of
    the sequences it declared it trained on, which the proof of computation tests) times the quality of its
    updates.  Twice the compute is twice the
    sequences trained, so it earns about twice the pay, and splitting it over two uids earns no more (each half
    has the same quality at best); a peer whose updates help less than the median earns less per sequence."""
    if not work:
        return 0.0
    return statistics.fmean(work) * quality_


def peer_score(mu: float, rating: float, passed: bool) -> float:
    """PeerScore: the LossRating when the proof of computation passes (``passed``, from ``poc_passes``), else
    ``min(μ, rating, 0)``.

    The gate decides whether a peer is paid, the rating how much: μ no longer multiplies the rating, because an
    honest μ is mostly noise around 0 and would pay equal peers unequally.  A peer that failed on its record (μ
    below the floor, so μ < 0) scores below 0, so it never enters the top-G list as a neutral newcomer; one not
    evaluated yet (μ = 0) scores 0.  Non-decreasing in μ and in the rating (a penalty can only lower the score).
    Non-finite inputs give ``MU_MIN`` (no weight)."""
    if not (math.isfinite(mu) and math.isfinite(rating)):
        return MU_MIN  # no weight; finite, so every score stays a number (the inputs are bounded anyway)
    return rating if passed else min(mu, rating, 0.0)


def paper_peer_score(mu: float, rating: float) -> float:
    """The Gauntlet paper's PeerScore: the proof-of-computation average μ times the LossRating (non-finite: MU_MIN).
    Two negatives make no reward: when either factor is at most 0 the score is the lower of them and 0."""
    if not (math.isfinite(mu) and math.isfinite(rating)):
        return MU_MIN
    return mu * rating if mu > 0 and rating > 0 else min(mu, rating, 0.0)


def help_median(loss_scores: Iterable[float]) -> float | None:
    """The window's reference for help ratios: the median LossScore of the evaluated updates that lowered the loss
    (finite and > 0); None when none did.

    Updates that did no work (a free-rider's 0, noise below 0) are left out: counted, they pull the median toward
    0 late in a run, when honest LossScores are small, and a noise update that happens to score just above 0 then
    passes as help (a default ``make run``: 0.0012 against a median of 0.0056 with them, 0.0083 without;
    docs/scoring.md, "Fair, stable weights")."""
    helped = [x for x in loss_scores if math.isfinite(x) and x > 0]
    return statistics.median(helped) if helped else None


def help_ratio(loss_score: float, median: float | None) -> float:
    """How much one evaluated update helped, against the others evaluated in the same window: its LossScore over
    the window's median LossScore, at most 1 (1 = at least the median); −1 for an update that did not lower the
    loss (LossScore ≤ 0, NaN: no work, as in ``poc_no_work``).  Without a positive median (a cold start, a
    window where most updates hurt) a LossScore > 0 counts as 1."""
    if not loss_score > 0:
        return -1.0
    if median is None or not (median > 0 and math.isfinite(median)):
        return 1.0
    return min(1.0, loss_score / median)


def last_update_helped(loss_score: float | None) -> bool:
    """Whether a peer's last evaluated update lowered the loss on random data (LossScore > 0); ``None`` (never
    evaluated) is not held against it, NaN fails.  Such an update earns a proof-of-computation credit, and only
    such a peer enters the next top-G list while others can (its pay is the help gate's, scoring/help_gate.py)."""
    return loss_score is None or loss_score > 0


def copy_record_bars_pay(copies: int, passes: int) -> bool:
    """Whether a peer's record of copying bars it from pay: it was rejected as a copy in at least as many windows
    as it passed every check (and at least once).

    Copy detection decides each window on its own and can miss, or keep a copy over its author by a noisy
    proof-of-computation tie-break; a copier that slips through now and then must not be paid for those
    windows, while the author it copies — which keeps its update in most windows — must not lose its pay
    (docs/scoring.md, "Fair, stable weights")."""
    return copies > 0 and copies >= passes


def normalise_weights(scores: Mapping[int, float], power: float) -> dict[int, float]:
    """``x_p = (s_p − m)^c / Σ_k (s_k − m)^c`` over the clamped scores ``s = max(score, 0)``, with the
    shift ``m`` taken against the neutral score 0 of a peer that contributed nothing, so ``m = 0``.

    This equals the published min-shift whenever some peer is at or below 0 (the usual case: clamping
    puts every unhelpful peer at 0).  In a network where every peer scores above 0 the published form
    would pay the weakest honest peer nothing for no fault of its own; shifting against 0 does not.
    Non-positive (or NaN) scores get exactly 0; when nobody is positive every weight is 0."""
    raised = {uid: (s ** power if s > 0 and math.isfinite(s) else 0.0) for uid, s in sorted(scores.items())}
    total = math.fsum(raised.values())
    if total <= 0 or not math.isfinite(total):
        return {uid: 0.0 for uid in raised}
    return {uid: v / total for uid, v in raised.items()}


def smooth_weights(previous: Mapping[int, float], current: Mapping[int, float], rate: float) -> dict[int, float]:
    """Posted weights as an EMA of each window's weights: ``rate·current + (1 − rate)·previous``, renormalised.

    Only peers with a positive weight this window keep their history: a peer whose current weight is 0 (its
    score fell to 0 or below, it was banned, it left) is posted 0 at once, so smoothing never delays a drop to
    nothing.  ``rate = 1`` is no smoothing.  All-zero current weights stay all zero (nothing is posted)."""
    if not 0 < rate <= 1:
        raise ValueError(f"smoothing rate must be in (0, 1], got {rate}")
    mixed = {uid: (rate * w + (1.0 - rate) * _share(previous.get(uid, 0.0)) if w > 0 else 0.0)
             for uid, w in sorted(current.items())}
    total = math.fsum(mixed.values())
    if total <= 0 or not math.isfinite(total):
        return {uid: 0.0 for uid in mixed}
    return {uid: v / total for uid, v in mixed.items()}


def _share(w: float) -> float:
    """A previous weight as a share in [0, 1] (NaN → 0)."""
    return min(1.0, max(0.0, w)) if w == w else 0.0


def top_g(scores: Mapping[int, float], g: int) -> list[int]:
    """The G best peers with a positive score: score descending, ties by lower uid first."""
    ranked = sorted((uid for uid, s in scores.items() if s > 0 and math.isfinite(s)),
                    key=lambda uid: (-scores[uid], uid))
    return ranked[:g]


def competition_ranks(values: Mapping[int, float]) -> dict[int, int]:
    """Rank 0 = best (largest value); equal values share a rank ("1224" ranking).

    NaN counts as −inf, so a peer whose score is undefined ranks last."""
    clean = {uid: (v if v == v else -math.inf) for uid, v in values.items()}
    return {uid: sum(1 for w in clean.values() if w > v) for uid, v in clean.items()}
