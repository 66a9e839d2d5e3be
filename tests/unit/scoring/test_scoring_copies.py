"""Near-copies: the pure parts of scoring/copies.py, with literal expected values."""
import math

import torch

from dso.aggregation.robust import decoded_rows, gram
from dso.codec.codecs import NearCopyThresholds
from dso.codec.demo import DeMoCodec
from dso.protocol.rejections import Reason
from scoring.copies import cosines, find_copies, pair_groups, positive_fit

R = 1 / math.sqrt(2)


def test_cosines_from_a_gram_matrix_zero_rows_have_cosine_zero():
    X = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    C = cosines(gram(X))
    assert torch.allclose(C, torch.tensor([[1.0, R, 0.0], [R, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64))


def test_positive_fit_finds_a_mix_and_refuses_a_negative_coefficient():
    a, b = [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]
    X = torch.tensor([a, b, [1.0, 1.0, 0.0], [2.0, -1.0, 0.0], [1.0, 1.0, 2.0]])
    G = gram(X)
    r2, coeffs = positive_fit(G, 2, [0, 1])
    assert (r2, coeffs) == (1.0, [1.0, 1.0])
    assert positive_fit(G, 3, [0, 1]) == (0.0, [])            # 2a − b: the honest A is not a mix of its copier
    r2, coeffs = positive_fit(G, 4, [0, 1])
    assert coeffs == [1.0, 1.0] and r2 == 2 / 6               # explains the part in the span only
    assert positive_fit(gram(torch.zeros(3, 3)), 0, [1, 2]) == (0.0, [])


def test_pair_groups_join_near_copies_and_identical_digests():
    C = torch.eye(5, dtype=torch.float64)
    C[0, 1] = C[1, 0] = 0.97
    C[1, 2] = C[2, 1] = 0.96
    C[3, 4] = C[4, 3] = 0.5
    digests = {1: "x", 2: "y", 3: "z", 4: "w", 5: "w"}
    assert pair_groups([1, 2, 3, 4, 5], C, digests, 0.95) == [[1, 2, 3], [4, 5]]
    assert pair_groups([1, 2, 3, 4, 5], C, digests, 0.99) == [[4, 5]]


def _codec(dct=True):
    # lossless at this size (k = chunk, 32-bit values): the copies below are exactly what they say
    return DeMoCodec({"w": (8, 16), "b": (16,)}, chunk=16, topk=128, value_bits=32, dct=dct)


def _random(codec, seed):
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) for n, s in codec.shapes.items()}


def _window(codec):
    """uids 1–3 honest; 4 = 1 + noise, 5 = 0.9 × 2, 6 = mean of 1 and 3, 7 = the previous aggregate."""
    honest = {u: _random(codec, u) for u in (1, 2, 3)}
    previous = _random(codec, 99)
    noise = _random(codec, 7)
    dense = dict(honest)
    dense[4] = {n: honest[1][n] + 0.1 * noise[n] for n in codec.shapes}
    dense[5] = {n: 0.9 * honest[2][n] for n in codec.shapes}
    dense[6] = {n: 0.5 * (honest[1][n] + honest[3][n]) for n in codec.shapes}
    dense[7] = previous
    updates = {u: codec.compress(d, 0) for u, d in dense.items()}
    return updates, codec.compress(previous, 0)


def test_find_copies_catches_each_kind_and_the_author_keeps_its_update():
    codec = _codec()
    updates, previous = _window(codec)
    seen_together = {u: 0.0 for u in updates}

    def poc(tied, update, group):  # proof of computation favours the honest author (tested elsewhere)
        return {u: (1.0 if u in (1, 2, 3) else 0.0) for u in tied}

    out = find_copies(codec, updates, seen_together, poc, previous)
    assert {u: r.reason for u, r in out.items()} == {4: Reason.DUPLICATE, 5: Reason.DUPLICATE,
                                                     6: Reason.DUPLICATE, 7: Reason.DUPLICATE}
    assert out[4].detail == "near-copy of uid 1, whose assigned data it was trained on"
    assert out[5].detail == "near-copy of uid 2, whose assigned data it was trained on"
    assert out[6].detail.startswith("mix of uid 1, uid 3")
    assert out[7].detail.startswith("copy of the previous aggregate (cosine 1.000")
    # without the previous aggregate the replay is just another update
    assert 7 not in find_copies(codec, updates, seen_together, poc, None)


def test_the_copy_tie_break_uses_the_validators_order_not_the_peers():
    codec = _codec()
    updates, _ = _window(codec)
    updates = {u: updates[u] for u in (1, 2, 4)}

    def poc(tied, update, group):
        return {u: float(u == 1) for u in tied}

    # seen first at the close: the one seen first keeps it, whatever PoC says
    first = find_copies(codec, updates, {1: 5.0, 2: 0.0, 4: 0.0}, poc)
    assert list(first) == [1] and first[1].detail == "near-copy of uid 4, first seen later"
    # seen together: proof of computation decides
    assert list(find_copies(codec, updates, {1: 0.0, 2: 0.0, 4: 0.0}, poc)) == [4]


def test_honest_updates_are_left_alone_and_thresholds_move_the_line():
    codec = _codec()
    updates, previous = _window(codec)
    honest = {u: updates[u] for u in (1, 2, 3)}
    rows = decoded_rows(codec, list(honest.values()))
    C = cosines(gram(rows))
    assert float(C[0, 1]) < 0.5 and float(C[0, 2]) < 0.5
    assert find_copies(codec, honest, {u: 0.0 for u in honest}, lambda *a: {}, previous) == {}
    lax = NearCopyThresholds(pair=-1.0)
    assert len(find_copies(codec, honest, {u: 0.0 for u in honest}, lambda *a: {}, None, thresholds=lax)) == 2


def test_a_mix_is_caught_from_a_lower_cosine_under_inner_steps():
    """Under inner steps honest mixes stay far below paper mode's (docs/scoring.md): only *mix* changes.  Each codec
    carries its own thresholds; the sketch codec's updates are compared for exact copies only."""
    from dataclasses import replace

    from dso.codec.codecs import DEFAULT_THRESHOLDS
    from dso.codec.sketch import SketchCodec

    dct, raw_codec = _codec(), _codec(dct=False)
    steps, gradient = dct.near_copy_thresholds(True), dct.near_copy_thresholds(False)
    assert gradient == DEFAULT_THRESHOLDS and (steps.mix, gradient.mix) == (0.78, 0.9)
    assert replace(steps, mix=gradient.mix) == gradient
    raw = raw_codec.near_copy_thresholds(True)
    assert raw.mix == 0.5 and replace(raw, mix=gradient.mix) == gradient
    assert raw_codec.near_copy_thresholds(False) == gradient
    sketch = SketchCodec(dict(dct.shapes), dim=64)
    assert sketch.near_copy_thresholds(True) is None and sketch.near_copy_thresholds(False) is None


def test_the_mix_bar_rises_with_the_median_row():
    from scoring.copies import mix_bar

    t = NearCopyThresholds(mix=0.5, mix_margin=0.15, mix_cap=0.9)
    assert mix_bar([], t) == 0.5                                      # nothing tested
    assert mix_bar([0.8], t) == 0.9                                   # a lone row tested: caught only from the cap
    assert mix_bar([0.0, 0.2, 0.25, 0.8], t) == 0.5                   # median 0.225: the fixed bar
    assert math.isclose(mix_bar([0.66, 0.7, 0.72, 0.95], t), 0.86)   # median 0.71 + 0.15
    assert mix_bar([0.95, 0.96, 0.97], t) == 0.9                      # never above the cap
    assert mix_bar([0.7, 0.8], NearCopyThresholds(mix=0.9, mix_cap=0.9)) == 0.9  # paper mode: unchanged


def test_alike_updates_are_left_alone_by_the_relative_bar():
    """Eight honest rows sharing one direction (pair cosines about 0.6): each fits a mix of the others above the
    raw domain's *mix* (0.5).  The bar stands on the other rows' median, so only the copier (half of uid 1 and
    uid 2, a near-copy of uid 1) is caught; with the bar held at *mix* the honest rows would be mixes."""
    from dataclasses import replace

    codec = _codec()
    base = _random(codec, 100)
    dense = {u: {n: base[n] + 0.8 * _random(codec, u)[n] for n in codec.shapes} for u in range(1, 9)}
    dense[9] = {n: 0.5 * (dense[1][n] + dense[2][n]) + 0.16 * _random(codec, 9)[n] for n in codec.shapes}
    updates = {u: codec.compress(d, 0) for u, d in dense.items()}
    seen, raw = {u: 0.0 for u in updates}, _codec(dct=False).near_copy_thresholds(True)  # the raw domain's
    relative = find_copies(codec, updates, seen, lambda *a: {}, None, thresholds=raw)
    assert sorted(relative) == [9] and relative[9].detail.startswith("near-copy of uid 1")
    fixed = find_copies(codec, updates, seen, lambda *a: {}, None, thresholds=replace(raw, mix_cap=raw.mix))
    assert 9 in fixed and len(fixed) >= 5
