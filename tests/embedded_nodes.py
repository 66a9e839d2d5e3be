"""A node's configuration on the embedded S3 server and a LocalChain, for tests that build real validators
in-process (the production wiring: ``neurons.context.build_context``)."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from dso.config import Config, HParams
from dso.config_sources import from_dict
from storage.server import EmbeddedS3


def node_config(root: Path, s3: EmbeddedS3, name: str, wallets: str, corpus: str, cache: str, hp: HParams,
                **storage: object) -> Config:
    """Config of the node ``name`` (its wallet in ``wallets``, a bucket provisioned now, state under root/name)."""
    creds = s3.provision(name)
    return from_dict({
        "subtensor": {"network": "localchain", "localchain_path": str(root / "chain.sqlite")},
        "wallet": {"name": name, "path": wallets},
        "storage": {"endpoint": s3.endpoint, "region": s3.admin.region, "bucket": creds.bucket,
                    "access_key_id": creds.write_key_id, "secret_access_key": creds.write_secret,
                    "read_access_key_id": creds.read_key_id, "read_secret_access_key": creds.read_secret, **storage},
        "data": {"corpus": corpus, "cache_dir": cache},
        "neuron": {"state_dir": str(root / name)},
        "hparams": asdict(hp)})
