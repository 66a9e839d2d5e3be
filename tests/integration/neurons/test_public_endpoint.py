"""``--storage.public_endpoint``: a node writes through its own endpoint and publishes another one on chain for
readers (a CDN, a reverse proxy, a public name); one that cannot be published stops the node with a reason."""
from __future__ import annotations

import pytest

from dso.chain.local import LocalChain
from dso.chain.local_burn import FREE_REGISTRATION
from dso.chain.wallets import create_local_wallet
from dso.data.dataset import Dataset
from embedded_nodes import node_config
from embedded_nodes import tiny_node_hparams as tiny
from neurons.context import build_context
from neurons.lifecycle import Fatal
from storage.commitment import BucketInfo, parse_commitment
from storage.server import EmbeddedS3


@pytest.fixture(scope="module")
def network(tmp_path_factory, stdlib_corpus):
    root = tmp_path_factory.mktemp("public_endpoint")
    hp, cache = tiny(), str(root / "cache")
    hp.data_hash = Dataset.for_run(hp, str(stdlib_corpus), cache).data_hash
    with EmbeddedS3.start() as s3:
        chain = LocalChain.create(root / "chain.sqlite", block_time=0.2, tempo=10_000, commit_interval_blocks=0,
                                  immunity_blocks=10_000, weights_rate_limit=0, **FREE_REGISTRATION)
        wallets = str(root / "wallets")

        def config(name: str, **storage: object):
            chain.register(create_local_wallet(name, "default", wallets))
            return node_config(root, s3, name, wallets, str(stdlib_corpus), cache, hp, allow_loopback_endpoints=True,
                               **storage)
        yield chain, s3, config


def test_the_public_endpoint_is_what_the_chain_says(network):
    chain, s3, config = network
    ctx = build_context(config("behind-proxy", public_endpoint="http://127.0.0.1:9"), "miner", handle_signals=False)
    info = parse_commitment(chain.commitment(ctx.uid))
    assert isinstance(info, BucketInfo) and info.endpoint == "http://127.0.0.1:9", info
    ctx.own.client.put(ctx.own.bucket, "probe", b"x")  # the node itself still writes through its own endpoint
    assert ctx.own.client.head(ctx.own.bucket, "probe").size == 1


def test_a_public_endpoint_that_is_not_a_url_stops_the_node_with_the_reason(network):
    _, _, config = network
    with pytest.raises(Fatal) as stopped:
        build_context(config("bad-proxy", public_endpoint="not a url"), "miner", handle_signals=False)
    assert "endpoint" in stopped.value.message and "public_endpoint" in stopped.value.message, stopped.value.message
