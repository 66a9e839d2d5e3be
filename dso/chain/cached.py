"""A chain whose reads are cached per window: one metagraph, commitments and weights read per window.

A validator asks for the leader, the metagraph and commitments many times a
window; on the real chain each is a full RPC read.  :class:`CachedChain`
wraps any :class:`Chain`: reads are kept until the caller starts another
window (:meth:`CachedChain.begin_window`), at most ``max_age_seconds`` (a safety
net for a caller that never does), and until any write through it.  Facts
that cannot change are kept for good: the randomness and timestamp of a
produced block, and the metagraph and commitments as of a block before the
current one.  ``block()`` always asks the chain.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from dso.chain.base import Chain, Neuron, WeightRules

_KEEP_BLOCKS = 4096  # randomness / timestamps remembered

_T = TypeVar("_T")


class CachedChain(Chain):
    def __init__(self, inner: Chain, *, max_age_seconds: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.inner, self.max_age_seconds, self._clock = inner, max_age_seconds, clock
        self._window: Hashable = None
        self._reads: dict[str, tuple[Hashable, float, Any]] = {}
        self._blocks: OrderedDict[tuple[str, int], Any] = OrderedDict()
        self._lock = threading.RLock()
        self.hits = self.misses = 0

    @property
    def weights_version(self) -> int:  # type: ignore[override]  # a read-only view of the inner chain's attribute
        return self.inner.weights_version

    def __repr__(self) -> str:
        return f"CachedChain({self.inner!r})"

    # --------------------------------------------------------------- cache
    def begin_window(self, window: Hashable) -> None:
        """Reads from now on belong to ``window``; those of another window are dropped."""
        with self._lock:
            if window != self._window:
                self._window = window
                self._reads.clear()

    def invalidate(self) -> None:
        with self._lock:
            self._reads.clear()

    def _cached(self, name: str, read: Callable[[], _T]) -> _T:
        with self._lock:
            hit = self._reads.get(name)
            if hit is not None and hit[0] == self._window and self._clock() - hit[1] <= self.max_age_seconds:
                self.hits += 1
                cached: _T = hit[2]
                return cached
            self.misses += 1
            value = read()
            self._reads[name] = (self._window, self._clock(), value)
            return value

    def _per_block(self, name: str, block: int, read: Callable[[], _T]) -> _T:
        with self._lock:
            if (name, block) in self._blocks:
                known: _T = self._blocks[(name, block)]
                return known
            value = read()
            self._blocks[(name, block)] = value
            if len(self._blocks) > _KEEP_BLOCKS:
                self._blocks.popitem(last=False)
            return value

    # --------------------------------------------------------------- reads
    def block(self) -> int:
        return self.inner.block()

    def block_timestamp(self, block: int) -> float:
        if block > self.inner.block():  # a scheduled time, not a fact yet
            return self.inner.block_timestamp(block)
        return self._per_block("timestamp", block, lambda: self.inner.block_timestamp(block))

    def randomness(self, block: int) -> bytes:
        return self._per_block("randomness", block, lambda: self.inner.randomness(block))

    def metagraph(self, block: int | None = None) -> list[Neuron]:
        if block is None:
            return self._cached("metagraph", self.inner.metagraph)
        return self._settled("metagraph", block, lambda: self.inner.metagraph(block))

    def commitments(self, block: int | None = None) -> dict[int, str]:
        if block is None:
            return self._cached("commitments", self.inner.commitments)
        return self._settled("commitments", block, lambda: self.inner.commitments(block))

    def _settled(self, name: str, block: int, read: Callable[[], _T]) -> _T:
        """State as of ``block``, kept for good once a later block exists (nothing can change it then)."""
        if block >= self.inner.block():
            return read()
        return self._per_block(name, block, read)

    def weights(self) -> dict[int, dict[int, float]]:
        return self._cached("weights", self.inner.weights)

    def weight_rules(self) -> WeightRules:
        return self._cached("weight_rules", self.inner.weight_rules)

    def ledger(self) -> list[dict[str, Any]]:
        return self.inner.ledger()

    def verify_ledger(self) -> list[str]:
        return self.inner.verify_ledger()

    # -------------------------------------------------------------- writes
    def register(self, wallet: Any) -> int:
        try:
            return self.inner.register(wallet)
        finally:
            self.invalidate()

    def commit(self, wallet: Any, data: str) -> None:
        try:
            self.inner.commit(wallet, data)
        finally:
            self.invalidate()

    def set_weights(self, wallet: Any, uids: list[int], weights: list[float],
                    version_key: int | None = None) -> None:
        try:
            self.inner.set_weights(wallet, uids, weights, version_key)
        finally:
            self.invalidate()

    def append_ledger(self, wallet: Any, record: dict[str, Any]) -> str:
        return self.inner.append_ledger(wallet, record)

    def close(self) -> None:
        self.inner.close()
