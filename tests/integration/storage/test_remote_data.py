"""The training corpus served from a dataset bucket (every test on moto and on SeaweedFS, see conftest.py):
published shards read with ranged GETs read exactly as the local shards; the next assignment is fetched in the
background; the cache stays within its bound; and the faults: an endpoint that stops answering mid-run (one line,
waits, resumes, no wrong token), a chunk changed in the bucket (refused by its hash, named), a manifest that is not
the run's (refused at start, one line)."""
from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from dso.config.schema import DataConfig, HParams, ModelConfig, StorageConfig
from dso.data.corpus import DataError
from dso.data.dataset import Dataset
from dso.data.remote_source import DataStopped
from dso.data.shard_writer import write_shards
from dso.data.shards import open_shards
from dso.data.tokenizer import Tokenizer, TokenizerSpec, train_bpe
from repo import ROOT
from sim.localnet import wait_for
from storage.client import S3Client
from storage.dataset import open_dataset, open_remote
from storage.dataset_upload import publish
from switch_proxy import SwitchProxy

SEQ, CHUNK, SHARD_TOKENS = 32, 4096, 60_000
_names = itertools.count()


@pytest.fixture(scope="module")
def text(tmp_path_factory, stdlib_corpus):
    path = tmp_path_factory.mktemp("text") / "a.txt"
    path.write_bytes(stdlib_corpus.read_bytes()[:200_000])
    return path


@pytest.fixture(scope="module")
def shards(tmp_path_factory, text):
    """Byte-level shards of 200 KB of prose: 4 shards of ~30 chunks of 4 KiB."""
    out = tmp_path_factory.mktemp("shards") / "out"
    write_shards([text], Tokenizer.bytes(), out, shard_tokens=SHARD_TOKENS, chunk_bytes=CHUNK)
    return out


@pytest.fixture(scope="module")
def local(shards) -> Dataset:
    return Dataset.from_shards(open_shards(shards), SEQ, 7, 0.05)


@pytest.fixture
def published(s3, shards):
    """(url, the dataset bucket's credentials): the shards published to a fresh bucket."""
    creds = s3.provision(f"dataset-{next(_names)}-{time.monotonic_ns() % 10**6}")
    url = f"s3://{creds.bucket}/corpora/prose"
    publish(shards, url, creds.write_client())
    return url, creds


@pytest.fixture(autouse=True)
def stop():
    """Set after each test: a reader still waiting for data then stops (DataStopped) instead of lingering."""
    event = threading.Event()
    yield event
    event.set()


def reading(read) -> tuple[threading.Thread, list]:
    """``read()`` in a thread (started); its result lands in the list.  A read stopped by the test's end is quiet."""
    got: list = []

    def run():
        try:
            got.append(read())
        except DataStopped:
            pass
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, got


def remote(url, creds, cache, stop, endpoint=None, cache_mb=1.0):
    client = S3Client(endpoint or creds.endpoint, creds.region, creds.read_key_id, creds.read_secret, max_attempts=1,
                      timeout=5, use_environment=False)
    shards = open_remote(url, client, str(cache), cache_mb, lambda s: not stop.wait(s), first_delay=0.05,
                         max_delay=0.2)
    return Dataset.from_shards(shards, SEQ, 7, 0.05), shards


def test_a_published_corpus_reads_as_the_local_shards(published, local, tmp_path, stop):
    url, creds = published
    listed = {o.key for o in creds.read_client().list(creds.bucket)}
    assert {f"corpora/prose/{name}" for name in ("manifest.json", "shard-00003.npy", "shard-00003.chunks")} <= listed
    ds, shards = remote(url, creds, tmp_path / "cache", stop, cache_mb=0.2)
    assert ds.data_hash == local.data_hash and ds.n_sequences == local.n_sequences and ds.remote
    corpus = shards.arrays[0].corpus
    rows = ds.assigned_rows(3, 5, 16)
    assert np.array_equal(ds.rows(rows), local.rows(rows))
    # ranged reads: 16 rows touch at most 2 chunks each (and each shard's chunk 0, its header), far fewer than
    # the corpus's ~100
    assert 0 < corpus.fetched_chunks <= 16 * 2 + 4 and corpus.fetched_bytes <= corpus.fetched_chunks * CHUNK
    assert np.array_equal(ds.validation(20), local.validation(20))
    rng = np.random.default_rng(1)
    assert np.array_equal(ds.unassigned(rng, rows, 8), local.unassigned(np.random.default_rng(1), rows, 8))


def test_the_cache_stays_within_its_bound(published, local, tmp_path, stop):
    url, creds = published
    ds, shards = remote(url, creds, tmp_path / "cache", stop, cache_mb=0.05)   # 12 chunks of 4 KiB
    corpus = shards.arrays[0].corpus
    for window in range(6):                       # 6 × 8 rows in ~all of the corpus's ~100 chunks
        rows = ds.assigned_rows(5, window, 8)
        assert np.array_equal(ds.rows(rows), local.rows(rows))
        on_disk = sum(p.stat().st_size for p in corpus.cache.dir.iterdir() if p.name != ".lock")
        assert on_disk <= 50_000 and corpus.cache.used <= 50_000
    assert corpus.cache.peak <= 50_000 and corpus.fetched_chunks > 12


def chunk_files(corpus) -> set[str]:
    return {p.name for p in corpus.cache.dir.glob("shard-*.npy.*")}


def test_read_ahead_held_past_its_bound_goes_to_the_disk_cache(published, local, tmp_path, stop):
    url, creds = published
    ds, shards = remote(url, creds, tmp_path / "cache", stop)
    corpus = shards.arrays[0].corpus
    corpus.held.limit = 3 * CHUNK
    rows = ds.assigned_rows(1, 4, 24)
    ds.prefetch(rows)
    settle(corpus)
    fetched = corpus.fetched_chunks
    assert corpus.held.peak <= 3 * CHUNK and corpus.held.spilled > 0
    assert len(chunk_files(corpus)) >= corpus.held.spilled                 # unread: kept on disk
    assert np.array_equal(ds.rows(rows), local.rows(rows))
    assert corpus.fetched_chunks == fetched                                 # every chunk from memory or disk


def settle(corpus) -> None:
    """Wait until the background fetches asked for so far are done."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (corpus._jobs or corpus.fetched_chunks == 0):
        time.sleep(0.05)


def test_an_assignment_is_read_as_training_reaches_it(published, local, tmp_path, stop):
    url, creds = published
    ds, shards = remote(url, creds, tmp_path / "cache", stop)
    corpus = shards.arrays[0].corpus
    rows, nxt = ds.assigned_rows(2, 10, 24), ds.assigned_rows(2, 11, 24)
    data = ds.assignment(2, 10, 24, 24, ahead=4, next_ahead=6)
    assert np.array_equal(data[0:4].numpy(), local.rows(rows[:4]))
    settle(corpus)
    fetched, files = corpus.fetched_chunks, chunk_files(corpus)
    # the next 4 sequences of this window and the first 6 of the next were fetched in the background, and
    # wait in memory for the reader: no cache file written for them
    assert len(corpus.held) > 0 and len(corpus.held) + len(files) == fetched
    assert np.array_equal(ds.rows(rows[4:8]), local.rows(rows[4:8]))
    assert np.array_equal(ds.rows(nxt[:6]), local.rows(nxt[:6]))
    assert corpus.fetched_chunks == fetched and chunk_files(corpus) == files
    # the rest of the window was not: training had not reached it
    assert np.array_equal(ds.rows(rows[8:]), local.rows(rows[8:]))
    assert corpus.fetched_chunks > fetched


def test_a_bpe_corpus_brings_its_tokeniser(s3, text, tmp_path):
    tok = train_bpe([text.read_text()], 300)
    write_shards([text], tok, tmp_path / "bpe", shard_tokens=SHARD_TOKENS, chunk_bytes=CHUNK)
    creds = s3.provision(f"dataset-bpe-{time.monotonic_ns() % 10**6}")
    done = publish(tmp_path / "bpe", f"s3://{creds.bucket}/bpe", creds.write_client())
    hp = HParams(tokenizer="bpe", model=ModelConfig(vocab_size=300, seq_len=SEQ), data_hash=done.data_hash)
    data = DataConfig(corpus=f"s3://{creds.bucket}/bpe", cache_dir=str(tmp_path / "cache"),
                      access_key_id=creds.read_key_id, secret_access_key=creds.read_secret)
    ds = open_dataset(hp, data, StorageConfig(endpoint=creds.endpoint))
    local = Dataset.from_config(str(tmp_path / "bpe"), "", SEQ, hp.seed, hp.val_fraction,
                                tokenizer=TokenizerSpec("bpe", 300))
    assert ds.tokenizer.hash == tok.hash and ds.data_hash == local.data_hash == done.data_hash
    assert np.array_equal(ds.validation(8), local.validation(8))


def test_an_endpoint_that_stops_answering_is_waited_for_in_one_line(published, local, tmp_path, caplog, stop):
    url, creds = published
    proxy = SwitchProxy(creds.endpoint)
    try:
        ds, shards = remote(url, creds, tmp_path / "cache", stop, endpoint=proxy.endpoint)
        first = ds.assigned_rows(1, 1, 8)
        assert np.array_equal(ds.rows(first), local.rows(first))
        proxy.down()
        later = ds.assigned_rows(1, 2, 8)
        with caplog.at_level(logging.INFO, logger="dso.data"):
            reader, got = reading(lambda: ds.rows(later))
            assert wait_for(lambda: proxy.refused >= 3, timeout=30, step=0.05)  # several retries while it is down
            assert reader.is_alive() and not got
            proxy.up()
            reader.join(30)
        assert got and np.array_equal(got[0], local.rows(later))
        lines = [r.getMessage() for r in caplog.records if r.name == "dso.data"]
        assert len([m for m in lines if "does not answer" in m]) == 1, lines
        assert len([m for m in lines if "answers again" in m]) == 1, lines
        assert len(lines) == 2, lines
    finally:
        proxy.close()


@pytest.mark.parametrize("read_ahead", [False, True])
def test_a_chunk_changed_in_the_bucket_is_refused_and_named(published, local, shards, tmp_path, caplog, stop,
                                                            read_ahead):
    url, creds = published
    ds, shard_set = remote(url, creds, tmp_path / "cache", stop)
    row = int(ds.assigned_rows(4, 3, 1)[0])
    shard = int(np.searchsorted(ds._starts, row, side="right") - 1)
    offset = 128 + (row - int(ds._starts[shard])) * (SEQ + 1) * 2      # the .npy header is 128 bytes
    name, chunk = f"shard-{shard:05d}.npy", offset // CHUNK
    original = (shards / name).read_bytes()
    altered = bytearray(original)
    altered[offset] ^= 1                                                # one bit of the row's first token
    key = url.split("/", 3)[3] + "/" + name
    writer = creds.write_client()
    writer.put(creds.bucket, key, bytes(altered))
    with caplog.at_level(logging.INFO, logger="dso.data"):
        if read_ahead:                                                  # fetched in the background first
            ds.prefetch(np.array([row]))
        reader, got = reading(lambda: ds.rows(np.array([row])))
        assert wait_for(lambda: any(r.levelno == logging.ERROR for r in caplog.records), timeout=30, step=0.05)
        assert reader.is_alive() and not got                            # no wrong token: nothing returned
        assert (shard, chunk) not in shard_set.arrays[0].corpus.held     # nor held for a reader
        refused = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(refused) == 1 and f"{name} chunk {chunk} " in refused[0].getMessage(), refused
        assert "refused: sha256" in refused[0].getMessage()
        writer.put(creds.bucket, key, original)                         # the operator repairs the bucket
        reader.join(30)
    assert got and np.array_equal(got[0], local.rows(np.array([row])))
    resumed = [r.getMessage() for r in caplog.records if "matches the manifest again" in r.getMessage()]
    assert len(resumed) == 1 and f"{name} chunk {chunk} " in resumed[0]


def test_a_manifest_that_is_not_the_runs_is_refused_at_start(published, local, tmp_path):
    url, creds = published
    hp = HParams(tokenizer="bytes", model=ModelConfig(vocab_size=256, seq_len=SEQ))
    hp.data_hash = local.data_hash[:16] + "0" * 48                      # same tokeniser, other text
    data = DataConfig(corpus=url, cache_dir=str(tmp_path / "cache"), access_key_id=creds.read_key_id,
                      secret_access_key=creds.read_secret)
    storage = StorageConfig(endpoint=creds.endpoint)
    with pytest.raises(DataError) as refused:
        open_dataset(hp, data, storage)
    message = str(refused.value)
    assert "\n" not in message and "this node would train on other text than its peers" in message
    assert url in message and "refusing to start" in message
    hp.data_hash = local.data_hash
    assert open_dataset(hp, data, storage).data_hash == local.data_hash
    for bad, why in [(dataclasses.replace(data, corpus=url + "-missing"), "not found"),
                     (dataclasses.replace(data, secret_access_key="wrong" * 8), "denied")]:
        with pytest.raises(DataError, match=why) as refused:
            open_dataset(hp, bad, storage)
        assert "\n" not in str(refused.value) and "--data.corpus" in str(refused.value)


def test_a_changed_digest_file_is_refused(s3, shards, tmp_path, caplog, stop):
    creds = s3.provision(f"dataset-dig-{time.monotonic_ns() % 10**6}")
    url = f"s3://{creds.bucket}/c"
    publish(shards, url, creds.write_client())
    creds.write_client().put(creds.bucket, "c/shard-00001.chunks", b"\0" * 32 * 40)
    ds, shards_set = remote(url, creds, tmp_path / "cache", stop)
    with caplog.at_level(logging.INFO, logger="dso.data"):
        reader, got = reading(lambda: np.asarray(shards_set.arrays[1][0:10]))
        refused = lambda: any("shard-00001.chunks refused" in r.getMessage() for r in caplog.records)  # noqa: E731
        assert wait_for(refused, timeout=30, step=0.05), caplog.records
        assert reader.is_alive() and not got


def test_chunks_are_checked_again_when_read_from_the_cache(published, local, tmp_path, stop):
    url, creds = published
    ds, shards = remote(url, creds, tmp_path / "cache", stop)
    rows = ds.assigned_rows(0, 0, 4)
    ds.rows(rows)
    corpus = shards.arrays[0].corpus
    for path in corpus.cache.dir.glob("shard-*.npy.*"):
        path.write_bytes(b"\x01" * path.stat().st_size)                 # a damaged cache, same sizes
    fetched = corpus.fetched_chunks
    assert np.array_equal(ds.rows(rows), local.rows(rows))
    assert corpus.fetched_chunks > fetched                              # fetched again, not trusted



def test_a_public_bucket_is_read_without_keys(s3, shards, local, tmp_path, stop):
    """Unsigned requests (no key anywhere: not the node's own AWS_ACCESS_KEY_ID either) read a public-read
    dataset bucket; a private one refuses them at start, in one line."""
    if s3.name != "seaweedfs":
        pytest.skip("the embedded moto server answers signed requests only (storage/server.py)")
    creds = s3.provision(f"dataset-pub-{time.monotonic_ns() % 10**6}")
    publish(shards, f"s3://{creds.bucket}/p", creds.write_client())
    hp = HParams(tokenizer="bytes", model=ModelConfig(vocab_size=256, seq_len=SEQ), data_hash=local.data_hash)
    hp.seed, hp.val_fraction = 7, 0.05
    data = DataConfig(corpus=f"s3://{creds.bucket}/p", cache_dir=str(tmp_path / "cache"))
    storage = StorageConfig(endpoint=creds.endpoint)
    with pytest.raises(DataError, match="denied") as refused:
        open_dataset(hp, data, storage)
    assert "\n" not in str(refused.value)
    s3.make_public(creds.bucket)
    ds = open_dataset(hp, data, storage)
    rows = ds.assigned_rows(1, 1, 8)
    assert np.array_equal(ds.rows(rows), local.rows(rows))


def test_prepare_data_publishes_a_folder_with_the_nodes_keys(s3, text, tmp_path):
    """`prepare_data.py FOLDER --upload s3://…` with a credentials file: shards, chunk digests and the manifest
    in the bucket, the data hash printed is the manifest's; a damaged shard folder is not published."""
    creds = s3.provision(f"dataset-cli-{time.monotonic_ns() % 10**6}")
    creds.save(tmp_path / "dataset.json")
    url = f"s3://{creds.bucket}/cli"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    script = ROOT / "scripts" / "prepare_data.py"
    done = subprocess.run([sys.executable, str(script), str(text.parent), "--out", str(tmp_path / "out"),
                           "--tokenizer", "bytes", "--upload", url, "--storage.credentials",
                           str(tmp_path / "dataset.json")], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    local = open_shards(tmp_path / "out")
    assert f"data hash (the manifest's; the run's hparams.data_hash): {local.data_hash}" in done.stdout
    assert f"--data.corpus {url} --data.endpoint {creds.endpoint}" in done.stdout
    keys = {o.key for o in creds.read_client().list(creds.bucket, prefix="cli/")}
    assert keys == {"cli/manifest.json", "cli/shard-00000.npy", "cli/shard-00000.chunks"}
    published = creds.read_client().get(creds.bucket, "cli/manifest.json")
    assert published == (tmp_path / "out" / "manifest.json").read_bytes()
    shard = tmp_path / "out" / "shard-00000.npy"
    shard.write_bytes(shard.read_bytes()[:-1] + b"\x07")
    again = subprocess.run([sys.executable, str(script), str(tmp_path / "out"), "--upload", url + "2",
                            "--storage.credentials", str(tmp_path / "dataset.json")],
                           capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 2 and "shard-00000.npy: sha256" in again.stderr, again.stderr
    assert not creds.read_client().list(creds.bucket, prefix="cli2/")
