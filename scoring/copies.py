"""Copied updates: two uids uploading the same, or nearly the same, update in one window.

A copier reads an honest upload during the put window and re-uploads it under
its own uid, exactly or disguised (noise added, scaled, mixed with another
peer's, or the previous window's public aggregate); sybils upload one update
under several uids.  Updates are compared by what they send, after the
per-tensor normalisation the aggregation applies (:func:`dso.aggregation.robust.decoded_rows`):

* **near-copy pair**: cosine of the normalised rows ≥ ``pair`` (or an identical
  content digest).  Pairs join into groups (connected components);
* **mix**: a peer in no pair whose row is close to what the codec makes of a
  *positive* combination of two or three of its nearest rows (the previous
  aggregate among the candidates): least squares picks the combination (R² ≥
  ``mix_r2`` to go on), then the combination is compressed and compared (cosine
  ≥ ``mix``, and ≥ the median row's + ``mix_margin`` for windows where every
  update is alike: :func:`mix_bar`).  Positive only:
  if C = (A + B)/2 then A = 2C − B, and the honest A must not be taken for a mix
  of its own copier;
* **previous aggregate**: cosine to the previous window's aggregate, compressed
  by the run's codec as a copier would, ≥ ``previous``.

Within a group the author keeps its update:

1. anyone first seen later than the earliest member (``times``: the validator's
   own observation, never a time the peer reports — see docs/scoring.md) is a copy;
2. members seen together are told apart by proof of computation: the update U
   was trained on its author's assigned data, so a signed step with it helps the
   author's data more than anyone else's.  How "improvable" a batch is varies a
   lot from batch to batch, so each member's data is also stepped with a control
   V — the consensus of the window's other updates — and the member with the
   largest ``L(θ − s·sign V, D_p) − L(θ − s·sign U, D_p)`` keeps the update (the
   unstepped loss cancels out of the comparison).

A mix and a copy of the previous aggregate have no author among the peers: they
are rejected outright.  Thresholds were set from the honest-pair distribution
measured in the simulator (docs/scoring.md, "Near-copies").

Cost: one Gram matrix of the decoded rows (which the contributions need anyway),
and two forward passes per tied member, only when a group exists.
"""
from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from dso.aggregation.robust import decoded_rows, gram, split_vector
from dso.codec.codecs import Codec, NearCopyThresholds, Update
from dso.nn.model import Decoder
from dso.protocol.commit import content_digest
from dso.protocol.rejections import Reason, Rejection
from dso.training.outer import peer_norms, reference_norms
from dso.training.outer_rules import outer_rule
from dso.training.train import evaluate
from scoring.evaluation import ParameterSnapshot, update_signs, update_step

if TYPE_CHECKING:
    from dso.config.schema import HParams
    from dso.data.dataset import Dataset

# (tied uids, their shared update, the whole copy group) -> uid -> gain
AuthorGain = Callable[[list[int], Update, list[int]], dict[int, float]]


def mix_bar(fit_cosines: Sequence[float], thresholds: NearCopyThresholds) -> float:
    """The window's bar for a row's recompressed cosine: *mix*, raised to the median of every tested row's first
    fit (``fit_cosines``) + *mix_margin*, up to *mix_cap*.

    Why: where peers start from the same θ_0 with fresh optimiser state and an empty error feedback (the first
    window, and a miner's first window wherever it joins), after few inner steps raw-domain updates are near sign
    vectors whose top-k keeps the largest-gradient coordinates (Adam's ε orders the ±lr values by |g|), which
    peers at the same θ_0 share, and any honest row fits a mix of the others (0.69–0.78 on the tests'
    model, against 0.25 afterwards).  A mix still stands out from the median (0.93–0.97 there); an honest peer's
    best mix stayed within 0.06 of it.  The price: mixers that outnumber the honest rows tested lift the bar
    towards the cap, and a lone row tested is caught only from the cap (docs/scoring.md, "The help gate's rule",
    item 7, which also says why the row tested counts in the median)."""
    if not fit_cosines:
        return thresholds.mix
    return max(thresholds.mix, min(thresholds.mix_cap, statistics.median(fit_cosines) + thresholds.mix_margin))


def cosines(G: torch.Tensor) -> torch.Tensor:
    """Cosine matrix from a Gram matrix; a zero (or non-finite) row has cosine 0 with everything."""
    norms = G.diagonal().clamp_min(0.0).sqrt()
    ok = torch.isfinite(norms) & (norms > 0)
    safe = torch.where(ok, norms, torch.ones_like(norms))
    C = G / (safe[:, None] * safe[None, :])
    C = torch.where(ok[:, None] & ok[None, :], C, torch.zeros_like(C))
    return torch.nan_to_num(C, nan=0.0, posinf=0.0, neginf=0.0)


def positive_fit(G: torch.Tensor, i: int, sources: Sequence[int]) -> tuple[float, list[float]]:
    """R² and coefficients of the least-squares fit of row i by the rows ``sources`` (from the Gram
    matrix); R² = 0 when the fit is degenerate or any coefficient is not positive."""
    S = list(sources)
    gii = float(G[i, i])
    if gii <= 0 or not math.isfinite(gii):
        return 0.0, []
    A, b = G[S][:, S], G[S, i]
    try:
        coeffs = torch.linalg.solve(A, b)
    except RuntimeError:  # singular: two identical sources; the pair test covers that case
        return 0.0, []
    if not bool(torch.isfinite(coeffs).all()) or bool((coeffs <= 0).any()):
        return 0.0, []
    r2 = float(coeffs @ b) / gii
    return (r2 if math.isfinite(r2) else 0.0), [float(c) for c in coeffs]


def best_mix(G: torch.Tensor, C: torch.Tensor, i: int, peers: Sequence[int], nearest: int,
             always: Sequence[int] = ()) -> tuple[float, list[int], list[float]]:
    """The best positive combination of 2 or 3 rows among row i's ``nearest`` most similar ``peers`` and the
    rows ``always`` (the previous aggregate): (R², sources, coefficients)."""
    ranked = sorted(peers, key=lambda j: (-float(C[i, j]), j))[:nearest] + list(always)
    best: tuple[float, list[int], list[float]] = (0.0, [], [])
    for size in (2, 3):
        for subset in itertools.combinations(ranked, size):
            r2, coeffs = positive_fit(G, i, subset)
            if r2 > best[0]:
                best = (r2, list(subset), coeffs)
    return best


def tensor_fit(rows: torch.Tensor, i: int, sources: Sequence[int], shapes: Mapping[str, tuple[int, ...]]
               ) -> torch.Tensor:
    """Row i refitted tensor by tensor by the rows ``sources`` (least squares, negative coefficients set to 0):
    a mix of raw updates is a different combination of the normalised rows in every tensor."""
    out, start = [], 0
    for shape in shapes.values():
        end = start + math.prod(shape)
        S = rows[list(sources), start:end].double()
        y = rows[i, start:end].double()
        coeffs = torch.linalg.lstsq(S.T, y.unsqueeze(1)).solution.squeeze(1).clamp_min(0.0)
        out.append(torch.nan_to_num(coeffs @ S, nan=0.0, posinf=0.0, neginf=0.0))
        start = end
    return torch.cat(out)


def recompressed_cosine(codec: Any, rows: torch.Tensor, i: int, sources: Sequence[int], window: int,
                        device: str | torch.device = "cpu") -> float:
    """Cosine between row i and the codec's compression of its tensor-by-tensor fit by ``sources``: what a peer
    mixing those sources would have sent.  Sharper than R² alone, which top-k truncation of a mix keeps near
    0.8 (docs/scoring.md)."""
    mixed = tensor_fit(rows, i, sources, codec.shapes)
    rebuilt = codec.compress(split_vector(mixed.float(), codec.shapes), window)
    row = decoded_rows(codec, [rebuilt], device)[0].double()
    target = rows[i].double()
    denom = float(row.norm() * target.norm())
    return float(row @ target) / denom if denom > 0 and math.isfinite(denom) else 0.0


def pair_groups(uids: Sequence[int], C: torch.Tensor, digests: Mapping[int, str], threshold: float
                ) -> list[list[int]]:
    """Connected components of 'near-copy' edges (cosine ≥ threshold, or the same content digest)."""
    parent = list(range(len(uids)))

    def root(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for a, b in itertools.combinations(range(len(uids)), 2):
        if float(C[a, b]) >= threshold or digests[uids[a]] == digests[uids[b]]:
            parent[root(a)] = root(b)
    groups: dict[int, list[int]] = {}
    for a, uid in enumerate(uids):
        groups.setdefault(root(a), []).append(uid)
    return [sorted(g) for g in groups.values() if len(g) > 1]


def copy_groups(digests: Mapping[int, str]) -> list[list[int]]:
    """Groups of identical content (kept for callers that have digests only)."""
    groups: dict[str, list[int]] = {}
    for uid in sorted(digests):
        groups.setdefault(digests[uid], []).append(uid)
    return [uids for uids in groups.values() if len(uids) > 1]


def _resolve_group(group: list[int], updates: Mapping[int, Update], times: Mapping[int, float],
                   author_gain: AuthorGain) -> dict[int, Rejection]:
    """Everyone in the group but its author: first seen wins; seen together, proof of computation decides."""
    first = min(times.get(u, math.inf) for u in group)
    tied = [u for u in group if times.get(u, math.inf) == first]
    out = {u: Rejection(Reason.DUPLICATE, f"near-copy of uid {tied[0]}, first seen later") for u in group
           if u not in tied}
    if len(tied) > 1:
        gains = author_gain(tied, updates[tied[0]], group)
        author = max(tied, key=lambda u: (gains.get(u, -math.inf), -u))
        for u in tied:
            if u != author:
                out[u] = Rejection(Reason.DUPLICATE, f"near-copy of uid {author}, whose assigned data it was "
                                                     "trained on")
    return out


def find_copies(codec: Codec, updates: Mapping[int, Update], times: Mapping[int, float], author_gain: AuthorGain,
                previous: Update | None = None, window: int = 0, inner_steps: bool = False,
                thresholds: NearCopyThresholds | None = None, device: str | torch.device = "cpu",
                rows: torch.Tensor | None = None) -> dict[int, Rejection]:
    """uid → DUPLICATE rejection for every near-copy but its author, every mix and every copy of the
    previous aggregate.

    ``times``: uid → when the validator first saw the upload (equal values: seen together; a peer's own
    LastModified must not be used).  ``author_gain(tied, update, group) -> {uid: gain}`` scores the tied
    members of a group (see :func:`assigned_gains`).  ``previous``: the previous window's aggregate,
    compressed by the run's codec (None at the first window); ``window``: the codec's window.  The thresholds are
    the codec's own (``codec.near_copy_thresholds``) for updates of inner steps (``inner_steps``) or of one
    gradient; ``thresholds`` replaces them for a codec that has some.  ``rows``: the updates'
    :func:`decoded_rows` (sorted uids, then ``previous``) when the caller has them already."""
    uids = sorted(updates)
    if not uids:
        return {}
    digests = {u: content_digest(codec.to_wire(updates[u])) for u in uids}
    own = codec.near_copy_thresholds(inner_steps)
    if own is None:  # a codec whose updates are compared for exact copies only
        out: dict[int, Rejection] = {}
        for group in copy_groups(digests):
            out.update(_resolve_group(group, updates, times, author_gain))
        return out
    thresholds = thresholds or own
    extra = [previous] if previous is not None else []
    if rows is None:
        rows = decoded_rows(codec, [updates[u] for u in uids] + extra, device)
    G = gram(rows)
    C = cosines(G)
    prev = len(uids) if extra else None
    out = {}
    for a, uid in enumerate(uids):
        if prev is not None and float(C[a, prev]) >= thresholds.previous:
            out[uid] = Rejection(Reason.DUPLICATE, f"copy of the previous aggregate (cosine {float(C[a, prev]):.3f})")
    live = [a for a, u in enumerate(uids) if u not in out]  # a copy of the aggregate is nobody's author
    groups = pair_groups([uids[a] for a in live], C[live][:, live], digests, thresholds.pair)
    for group in groups:
        out.update({u: r for u, r in _resolve_group(group, updates, times, author_gain).items() if u not in out})
    in_pair = {u for g in groups for u in g}
    out.update(_mixes(codec, rows, G, C, uids, out, in_pair, prev, thresholds, window, device))
    return out


def _mixes(codec: Codec, rows: torch.Tensor, G: torch.Tensor, C: torch.Tensor, uids: list[int],
           caught: Mapping[int, Rejection], in_pair: set[int], prev: int | None, thresholds: NearCopyThresholds,
           window: int, device: str | torch.device) -> dict[int, Rejection]:
    """uid → DUPLICATE for every row (not caught nor in a pair) that a mix of the others explains, the
    best-explained first: a mixer explains its sources better than they explain themselves through it (early in
    a run, when honest updates are alike, an honest peer can fit a mix that uses its own mixer)."""
    out: dict[int, Rejection] = {}
    pending = [a for a, uid in enumerate(uids) if uid not in caught and uid not in in_pair]
    fits: dict[int, tuple[float, list[int]]] = {}  # row → (recompressed cosine, sources), while its sources stand
    bar: float | None = None  # from every row's first fit (0: no mix explains it), the row tested included
    while pending:
        for a in pending:
            if a not in fits:
                peers = [b for b, other in enumerate(uids) if b != a and other not in caught and other not in out]
                r2, sources, _ = best_mix(G, C, a, peers, thresholds.nearest, [prev] if prev is not None else [])
                fits[a] = ((recompressed_cosine(codec, rows, a, sources, window, device), sources)
                           if r2 >= thresholds.mix_r2 else (0.0, sources))
        if bar is None:
            bar = mix_bar([fits[row][0] for row in pending], thresholds)
        a = max(pending, key=lambda row: (fits[row][0], -row))
        cos, sources = fits[a]
        if cos < bar:
            break
        names = ", ".join("the previous aggregate" if s == prev else f"uid {uids[s]}" for s in sources)
        out[uids[a]] = Rejection(Reason.DUPLICATE, f"mix of {names} (cosine {cos:.3f})")
        pending.remove(a)
        fits = {row: fit for row, fit in fits.items() if a not in fit[1]}  # refit those that used it
    return out


def _step_losses(model: Decoder, signs: dict[str, torch.Tensor] | None, step: float, batches: dict[int, torch.Tensor],
                 micro_batch: int) -> dict[int, float]:
    """Loss of each batch at θ − step·signs (θ itself when ``signs`` is None); θ is restored exactly."""
    device = next(model.parameters()).device
    if signs is None:
        return {u: evaluate(model, b, micro_batch, device) for u, b in batches.items()}
    snapshot = ParameterSnapshot(model)
    try:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.sub_(signs[name].to(p.device, p.dtype), alpha=step)
        return {u: evaluate(model, b, micro_batch, device) for u, b in batches.items()}
    finally:
        snapshot.restore()


def _median_norms(codec: Codec, updates: Mapping[int, Update]) -> dict[str, float]:
    norms = []
    for u in updates.values():
        try:
            norms.append(peer_norms(codec, u))
        except Exception:  # noqa: BLE001 — unreadable updates are rejected elsewhere
            continue
    return reference_norms(norms, list(codec.shapes))


def _control(mean: Mapping[str, torch.Tensor], like: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """sign(mean) (signed rule), or the mean rescaled per tensor to the norm of ``like``."""
    if like is None:
        return {n: torch.sign(d) for n, d in mean.items()}
    out: dict[str, torch.Tensor] = {}
    for n, d in mean.items():
        norm = float(torch.linalg.vector_norm(d))
        out[n] = d * (float(torch.linalg.vector_norm(like[n])) / norm) if norm > 0 else torch.zeros_like(d)
    return out


def assigned_gains(model: Decoder, codec: Codec, dataset: Dataset, hp: HParams, window: int, step: float,
                   updates: Mapping[int, Update]) -> AuthorGain:
    """``author_gain`` for :func:`find_copies`: for each tied uid, how much more a step with the copied
    update lowers the loss on the first ``batch_size`` sequences of its assignment (what a baseline miner
    trains on) than a step with the consensus of the window's other updates does."""

    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    signed = outer_rule(hp).signs
    reference = None if signed else _median_norms(codec, updates)

    def gain(tied: list[int], update: Update, group: list[int]) -> dict[int, float]:
        # the update's step as the network's outer rule would take it (scoring.evaluation.update_step), and
        # the consensus of the others rescaled to the same size per tensor: only the direction differs
        mine = update_signs(codec.decompress, update, shapes) if reference is None else \
            update_step(codec, update, hp, window, reference, shapes)
        if isinstance(mine, Rejection):
            return {}
        others = [updates[u] for u in sorted(updates) if u not in group]
        control = _control(codec.mean_delta(others), None if signed else mine) if others else None
        size = step if signed else 1.0
        batches = {u: dataset.training_batch(u, window, hp.assigned_sequences, hp.batch_size) for u in tied}
        with_control = _step_losses(model, control, size, batches, hp.micro_batch)
        with_update = _step_losses(model, mine, size, batches, hp.micro_batch)
        return {u: with_control[u] - with_update[u] for u in tied}

    return gain
