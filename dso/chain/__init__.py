"""Chain access: the :class:`Chain` interface and its backends."""
from dso.chain.base import Chain, ChainError, ChainUnavailable, Neuron

__all__ = ["Chain", "ChainError", "ChainUnavailable", "Neuron"]
