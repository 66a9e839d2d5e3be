"""Sync sample positions (shared by miners and validators) and the sync vector check."""
from __future__ import annotations

import math

import torch

from dso.rejections import Reason
from scoring.sync import check_sync_vector, sample_parameters, sync_positions

SHAPES = {"embed.weight": (256, 32), "blocks.0.attn_norm.weight": (32,), "blocks.0.attn.wq.weight": (32, 32),
          "tiny": (3,)}


def test_positions_are_deterministic_in_range_and_cover_every_tensor():
    a = sync_positions(b"\x01" * 32, SHAPES, 20)
    assert a == sync_positions(b"\x01" * 32, SHAPES, 20)
    assert len(a) == 20
    names = [name for name, _ in a]
    assert names[:4] == list(SHAPES) and set(names) == set(SHAPES)        # round robin in model order
    for name, index in a:
        assert 0 <= index < math.prod(SHAPES[name])
    big = [i for n, i in a if n == "embed.weight"]
    assert len(big) == len(set(big))                                      # distinct within a tensor


def test_positions_change_with_the_window_randomness():
    a = sync_positions(b"\x01" * 32, SHAPES, 16)
    b = sync_positions(b"\x02" * 32, SHAPES, 16)
    assert [n for n, _ in a] == [n for n, _ in b]
    assert [i for _, i in a] != [i for _, i in b]


def test_tiny_tensor_repeats_instead_of_looping_forever():
    positions = sync_positions(b"r", {"tiny": (2,)}, 5)
    assert len(positions) == 5 and {i for _, i in positions} == {0, 1}
    assert sync_positions(b"r", SHAPES, 0) == [] and sync_positions(b"r", {}, 4) == []


def test_sample_parameters_reads_flat_indices():
    named = {"a": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.tensor([5.0, -1.0])}
    out = sample_parameters(named, [("a", 0), ("a", 7), ("b", 1)])
    assert out.dtype == torch.float32
    assert out.tolist() == [0.0, 7.0, -1.0]
    assert sample_parameters(named, []).shape == (0,)


def test_check_sync_vector_reasons():
    assert check_sync_vector(torch.zeros(4), 4) is None
    assert check_sync_vector([0.0] * 4, 4).reason is Reason.MALFORMED
    assert check_sync_vector(torch.zeros(4, dtype=torch.float64), 4).reason is Reason.BAD_DTYPE
    assert check_sync_vector(torch.zeros(5), 4).reason is Reason.BAD_SHAPE
    assert check_sync_vector(torch.zeros(2, 2), 4).reason is Reason.BAD_SHAPE
    bad = torch.zeros(4)
    bad[2] = math.inf
    assert check_sync_vector(bad, 4).reason is Reason.NON_FINITE
    assert check_sync_vector(torch.zeros(4), 4) is None
