"""The SeaweedFS server command operators copy from docs/deployment.md is the one the tests start, and it holds
a network: 40 peers' buckets plus the dataset bucket, each with its own keys; SIGTERM stops it."""
from __future__ import annotations

import numpy as np
import pytest

from dso.data.dataset import Dataset
from dso.data.shard_writer import write_shards
from dso.data.shards import open_shards
from dso.data.tokenizer import Tokenizer
from storage.dataset import open_remote
from storage.dataset_upload import publish
from storage.engines import engine_problem
from storage.seaweedfs import SERVER_FLAGS, SeaweedS3

PEERS = 40


def test_the_server_holds_40_peers_and_the_dataset_and_stops_on_sigterm(tmp_path, stdlib_corpus):
    problem = engine_problem("seaweedfs")
    if problem:
        pytest.skip(problem)
    engine = SeaweedS3.start()
    try:
        assert all(flag in engine._process.args for flag in SERVER_FLAGS)   # type: ignore[operator]
        for i in range(PEERS):
            peer = engine.provision(f"peer{i:02d}")
            peer.write_client().put(peer.bucket, "gradient/1/0-v1.safetensors", f"update {i}".encode())
            assert peer.read_client().get(peer.bucket, "gradient/1/0-v1.safetensors") == f"update {i}".encode()
        dataset = engine.provision("dataset")
        (tmp_path / "text.txt").write_bytes(stdlib_corpus.read_bytes()[:100_000])
        write_shards([tmp_path / "text.txt"], Tokenizer.bytes(), tmp_path / "shards", chunk_bytes=4096)
        publish(tmp_path / "shards", f"s3://{dataset.bucket}/c", dataset.write_client())
        remote = open_remote(f"s3://{dataset.bucket}/c", dataset.read_client(), str(tmp_path / "cache"), 1.0)
        local = open_shards(tmp_path / "shards")
        ds, expected = (Dataset.from_shards(s, 32, 1, 0.05) for s in (remote, local))
        rows = ds.assigned_rows(1, 1, 16)
        assert np.array_equal(ds.rows(rows), expected.rows(rows))
        stopped_in = engine.terminate(timeout=60)
        assert stopped_in is not None, "weed did not exit within 60 s of SIGTERM"
        assert engine._process.returncode is not None
        print(f"weed server exited {stopped_in:.1f} s after SIGTERM")
    finally:
        engine.stop()
