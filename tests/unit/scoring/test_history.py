"""Replays and empty updates (scoring/history.py): sketches keep cosines, a replay of any earlier upload or aggregate
is rejected, honest updates are not, and the history survives a save."""
from __future__ import annotations

import copy
import hashlib

import pytest
import torch

from dso.codec.codecs import make_codec
from dso.config.schema import HParams
from dso.nn.model import build_model, parameter_shapes
from dso.protocol.rejections import Reason
from dso.training.outer import OuterState
from neurons.engine import WindowInputs, run_window
from scoring.history import AGGREGATE, SKETCH_DIM, Sketcher, UploadHistory, find_replays, is_empty
from scoring.state import ValidatorState


def rows(n: int, length: int = 5000, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(length, generator=g) for _ in range(n)]


def test_a_count_sketch_keeps_cosines_within_its_error():
    sketcher = Sketcher(20_000)
    g = torch.Generator().manual_seed(1)
    base = torch.randn(20_000, generator=g)
    for mix in (0.0, 0.3, 0.6, 0.9, 1.0):
        other = mix * base + (1 - mix ** 2) ** 0.5 * torch.randn(20_000, generator=g)
        exact = float(torch.nn.functional.cosine_similarity(base, other, dim=0))
        a, b = sketcher.sketch(base), sketcher.sketch(other)
        approx = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
        assert approx == pytest.approx(exact, abs=5 / SKETCH_DIM ** 0.5), mix   # 5 standard errors
    assert torch.equal(Sketcher(20_000).sketch(base), sketcher.sketch(base))     # a fixed hash: every node alike
    with pytest.raises(ValueError, match="rows have 20000"):
        sketcher.sketch(torch.zeros(10))


def test_replays_of_own_and_other_uploads_and_of_aggregates_are_caught_and_fresh_updates_are_not():
    history = UploadHistory()
    first = rows(3, seed=1)
    assert find_replays(history, 5, dict(zip((1, 2, 3), first, strict=True)), None) == {}
    fresh = rows(3, seed=2)
    aggregate = rows(1, seed=3)[0]
    assert find_replays(history, 6, dict(zip((1, 2, 3), fresh, strict=True)), aggregate) == {}
    # window 9: uid 1 sends its own update of window 5 again, uid 2 uid 3's of window 6 with a little noise, uid 3
    # the aggregate of window 5 (joined the history at window 6), uid 4 something new, uid 5 nothing at all
    g = torch.Generator().manual_seed(4)
    got = find_replays(history, 9, {1: first[0], 2: fresh[2] + 0.1 * torch.randn(5000, generator=g),
                                    3: aggregate.clone(), 4: rows(1, seed=9)[0], 5: torch.zeros(5000)}, None)
    assert {uid: r.reason for uid, r in got.items()} == {1: Reason.REPLAY, 2: Reason.REPLAY, 3: Reason.REPLAY,
                                                          5: Reason.EMPTY}
    assert "uid 1's update of window 5" in got[1].detail and "uid 3's update of window 6" in got[2].detail
    assert "an aggregate of window 5" in got[3].detail
    # peers rejected for something else are not judged again, and a replay of the same window is not looked for
    assert find_replays(history, 10, {1: first[0]}, None, skip=[1]) == {}
    assert find_replays(history, 11, {7: torch.ones(5000), 8: torch.ones(5000)}, None) == {}


def test_the_history_forgets_what_is_older_than_its_windows_and_survives_a_save():
    history = UploadHistory(windows=4)
    old = rows(1, seed=5)[0]
    find_replays(history, 0, {1: old}, None)
    for window in range(1, 5):
        find_replays(history, window, {1: rows(1, seed=10 + window)[0]}, None)
    assert 0 not in {e.window for e in history.entries}
    assert find_replays(history, 5, {2: old}, None) == {}                     # too old to be remembered
    again = UploadHistory.from_tensors(history.to_tensors(), windows=4)
    assert [(e.window, e.label) for e in again.entries] == [(e.window, e.label) for e in history.entries]
    assert all(torch.equal(a.sketch, b.sketch) for a, b in zip(again.entries, history.entries, strict=True))
    clone = copy.deepcopy(history)
    clone.add(5, AGGREGATE, torch.ones(SKETCH_DIM))
    assert len(clone.entries) == len(history.entries) + 1                     # the copy's list is its own


@pytest.mark.parametrize("broken, message", [
    ({"index": torch.zeros((1, 2), dtype=torch.int64)}, "index and sketches"),
    ({"index": torch.zeros((1, 3), dtype=torch.int64), "sketches": torch.zeros((1, SKETCH_DIM))}, "shape"),
    ({"index": torch.zeros((1, 2), dtype=torch.int64), "sketches": torch.zeros((2, SKETCH_DIM))}, "sketches"),
    ({"index": torch.tensor([[0, -5]]), "sketches": torch.zeros((1, SKETCH_DIM))}, "label"),
    ({"index": torch.zeros((1, 2), dtype=torch.int64), "sketches": torch.full((1, SKETCH_DIM), float("nan"))},
     "finite"),
])
def test_a_damaged_history_is_refused_with_a_reason(broken, message):
    with pytest.raises(ValueError, match=message):
        UploadHistory.from_tensors(broken)


def test_empty_updates():
    assert is_empty(torch.zeros(10)) and is_empty(torch.full((3,), float("nan"))) and is_empty(torch.zeros(0))
    assert not is_empty(torch.tensor([0.0, 1e-30]))


def test_a_window_without_uploads_after_one_with_an_aggregate_is_scored(tiny_hparams, stdlib_corpus, tmp_path):
    """The validator crashed here once: no payload this window, and the previous aggregate to replay."""
    from dso.data.dataset import Dataset
    hp: HParams = tiny_hparams
    model = build_model(hp.model, hp.seed)
    codec = make_codec(parameter_shapes(model), hp)
    dataset = Dataset.from_config(str(stdlib_corpus), str(tmp_path), hp.model.seq_len, hp.seed, hp.val_fraction)
    previous = {n: torch.full(s, 1e-3) for n, s in codec.shapes.items()}
    seed = hashlib.sha256(b"w").digest()
    inputs = WindowInputs(3, {}, {}, {1: "hk"}, [], seed, seed, previous_aggregate=previous)
    outcome = run_window(ValidatorState.new(), model, codec, dataset, hp, inputs,
                         outer=OuterState.fresh(codec.shapes, hp), ledger_prev_hash="", validator="v")
    assert outcome.report.rejections == {1: "missing: no payload this window"}
