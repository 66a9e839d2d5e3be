"""A node's configuration on the embedded S3 server and a LocalChain, for tests that build real validators
in-process (the production wiring: ``neurons.context.build_context``)."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from dso.config.schema import Config, HParams, ModelConfig
from dso.config.sources import from_dict
from paper_training import use_paper_training
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


def tiny_node_hparams() -> HParams:
    """A tiny model and short windows for in-process nodes (validators, the simulator) in paper mode: identity
    holds in any mode; paper mode keeps every window's list non-trivial in 6 windows."""
    hp = HParams(model=ModelConfig(vocab_size=256, d_model=32, n_layers=1, n_heads=2, ffn_hidden=64, seq_len=32),
                 tokenizer="bytes")
    hp.batch_size, hp.assigned_sequences, hp.micro_batch, hp.chunk, hp.topk = 8, 16, 8, 16, 8
    hp.eval_sequences, hp.eval_peers, hp.learning_rate, hp.warmup_windows = 8, 4, 5e-3, 0
    hp.topg, hp.checkpoint_every = 4, 3
    hp.inner.steps_max = 2  # the assignment holds steps_max × batch_size
    # identity holds in any mode; paper mode keeps every window's list non-trivial in 6 windows (with inner steps
    # and the sgd rule an early list can hold only a freerider, and the model does not move: see the steps test)
    use_paper_training(hp)
    return hp
