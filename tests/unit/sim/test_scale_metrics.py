"""The equivalence figures of sim/scale.py (bench.py's scale section) on hand-computed cases."""
import numpy as np
import pytest

from sim.scale import index_agreement, relative_l2


def test_relative_l2_is_the_distance_over_the_reference_norm():
    b = {"w": np.array([3.0, 4.0]), "v": np.array([0.0])}
    a = {"w": np.array([3.0, 4.0]), "v": np.array([0.5])}
    assert relative_l2(a, b) == pytest.approx(0.5 / 5.0)
    assert relative_l2(b, b) == 0.0


def test_index_agreement_counts_kept_indices_in_common_per_chunk():
    ref = {"w": np.array([[0, 1, 2, 3], [4, 5, 6, 7]]), "v": np.array([[1, 9]])}
    same_rows = {"w": np.array([[0, 1, 2, 3], [4, 5, 6, 7]]), "v": np.array([[1, 9]])}
    other = {"w": np.array([[0, 1, 2, 9], [7, 6, 5, 4]]), "v": np.array([[9, 2]])}  # 3 + 4 + 1 of 10 kept
    assert index_agreement(same_rows, ref) == 1.0
    assert index_agreement(other, ref) == pytest.approx(8 / 10)
    shifted = {"w": np.array([[4, 5, 6, 7], [0, 1, 2, 3]]), "v": np.array([[1, 9]])}  # right indices, wrong chunks
    assert index_agreement(shifted, ref) == pytest.approx(2 / 10)
