"""ZIP-400 §5 contribution score."""
from __future__ import annotations

import math

import pytest
import torch

from dso.aggregation.contribution import contribution_score, cosine, normalised_gains, round_contributions


def test_score_formula_by_hand():
    assert contribution_score(1.0, 1.0, 1.0) == pytest.approx(1.0)
    assert contribution_score(0.6, 0.5, 0.25) == pytest.approx(0.5 * 0.6 + 0.3 * 0.5 + 0.2 * 0.25)
    assert contribution_score(-0.9, 0.5, 0.0) == pytest.approx(0.15)  # opposition earns nothing, no more
    assert contribution_score(0.0, -1.0, -1.0) == pytest.approx(-0.2)  # harmful update: the floor
    assert contribution_score(0.0, 7.0, 9.0) == pytest.approx(0.5)  # clamped terms
    assert contribution_score(math.nan, math.inf, -math.inf) == 0.0


def test_cosine_and_gains():
    assert cosine(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0])) == pytest.approx(1 / math.sqrt(2))
    assert cosine(torch.zeros(3), torch.ones(3)) == 0.0
    assert normalised_gains({1: 0.02, 2: -0.04, 3: 0.0}) == {1: 0.5, 2: -1.0, 3: 0.0}
    assert normalised_gains({1: 0.0}) == {1: 0.0}
    assert normalised_gains({1: math.nan, 2: 0.1}) == {1: 0.0, 2: 1.0}


def test_round_contributions():
    aggregate = torch.tensor([1.0, 1.0, 0.0])
    updates = {5: torch.tensor([2.0, 2.0, 0.0]), 3: torch.tensor([-1.0, -1.0, 0.0]), 8: torch.tensor([1.0, 0.0, 0.0])}
    out = round_contributions(updates, aggregate, mu={5: 0.4, 3: 0.9, 8: -0.3}, loss_scores={5: 0.01, 3: -0.02})
    assert list(out) == [3, 5, 8]
    assert out[5].score == pytest.approx(0.5 * 1.0 + 0.3 * 0.4 + 0.2 * 0.5) and out[5].evaluated
    assert out[3].score == pytest.approx(0.3 * 0.9 + 0.2 * -1.0) and out[3].alignment == pytest.approx(-1.0)
    assert out[8].score == pytest.approx(0.5 / math.sqrt(2)) and not out[8].evaluated and out[8].gain == 0.0
    assert out[8].to_dict()["uid"] == 8
