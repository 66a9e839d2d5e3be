"""Chain access: the :class:`Chain` interface and its backends."""
from typing import Any

from dso.chain.base import Chain, ChainError, ChainUnavailable, Neuron

__all__ = ["Chain", "ChainError", "ChainUnavailable", "Neuron", "LocalChain", "BittensorChain", "open_chain"]

# Backends import the bittensor SDK (slow to import); load them only when asked for.
_LAZY = {"LocalChain": "dso.chain.local", "BittensorChain": "dso.chain.bittensor_chain",
         "open_chain": "dso.chain.factory"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dso.chain' has no attribute {name!r}")
