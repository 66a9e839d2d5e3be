"""Pick the chain backend a configuration names: the embedded LocalChain or a real Subtensor network."""
from __future__ import annotations

from dso.chain.base import Chain
from dso.config.schema import Config, expand

LOCAL_NETWORK = "localchain"


def open_chain(cfg: Config, *, allow_burned_register: bool = False) -> Chain:
    """``--subtensor.network localchain`` opens the SQLite file at ``--subtensor.localchain_path``
    (ChainUnavailable with a how-to if absent); any other value (``finney``, ``test``, ``local``,
    ``ws://...``) connects lazily to that Subtensor, subnet ``--netuid``."""
    if cfg.subtensor.network == LOCAL_NETWORK:
        from dso.chain.local import LocalChain

        chain = LocalChain.open(expand(cfg.subtensor.localchain_path))
        chain.weights_version = cfg.subtensor.weights_version
        return chain
    from dso.chain.bittensor_chain import BittensorChain

    return BittensorChain(cfg.subtensor.network, cfg.netuid, allow_burned_register=allow_burned_register,
                          weights_version=cfg.subtensor.weights_version)
