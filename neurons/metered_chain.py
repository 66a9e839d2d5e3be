"""A chain that reports the outcome of every write, so the node's metrics show them (docs/operations.md).

:class:`MeteredChain` wraps any :class:`~dso.chain.base.Chain` backend and delegates every call; the writes
(``register``, ``commit``, ``set_weights``, ``append_ledger``) also report ``(call, result)`` — ``ok`` or the
:class:`~dso.chain.ChainError`'s short reason — and raise exactly what the backend raised.  The node's code
never sees the difference.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from dso.chain import Chain, ChainError
from dso.chain.base import Neuron

Report = Callable[[str, str], None]
T = TypeVar("T")


class MeteredChain(Chain):
    def __init__(self, inner: Chain, report: Report):
        self.inner, self.report = inner, report

    def _write(self, call: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            out = fn(*args)
        except ChainError as e:
            self.report(call, e.reason)
            raise
        except Exception:
            self.report(call, "error")
            raise
        self.report(call, "ok")
        return out

    # ------------------------------------------------------------- writes
    def register(self, wallet: Any) -> int:
        return self._write("register", self.inner.register, wallet)

    def commit(self, wallet: Any, data: str) -> None:
        self._write("commit", self.inner.commit, wallet, data)

    def set_weights(self, wallet: Any, uids: list[int], weights: list[float], version_key: int | None = None) -> None:
        self._write("set_weights", self.inner.set_weights, wallet, uids, weights, version_key)

    def append_ledger(self, wallet: Any, record: dict[str, Any]) -> str:
        return self._write("append_ledger", self.inner.append_ledger, wallet, record)

    # -------------------------------------------------------------- reads
    def block(self) -> int:
        return self.inner.block()

    def block_timestamp(self, block: int) -> float:
        return self.inner.block_timestamp(block)

    def randomness(self, block: int) -> bytes:
        return self.inner.randomness(block)

    def metagraph(self, block: int | None = None) -> list[Neuron]:
        return self.inner.metagraph(block)

    def commitments(self, block: int | None = None) -> dict[int, str]:
        return self.inner.commitments(block)

    def weights(self) -> dict[int, dict[int, float]]:
        return self.inner.weights()

    # a backend may implement the helpers its own way: use its versions
    def uid_of(self, hotkey: str) -> int | None:
        return self.inner.uid_of(hotkey)

    def commitment(self, uid: int) -> str | None:
        return self.inner.commitment(uid)

    def leading_validator(self) -> Neuron | None:
        return self.inner.leading_validator()

    def close(self) -> None:
        self.inner.close()

    def ledger(self) -> list[dict[str, Any]]:
        return self.inner.ledger()

    def verify_ledger(self) -> list[str]:
        return self.inner.verify_ledger()

    def __getattr__(self, name: str) -> Any:
        """Anything else a backend offers (e.g. LocalChain.add_stake), unmetered."""
        if name == "inner":  # not set yet (copy, unpickling): never recurse
            raise AttributeError(name)
        return getattr(self.inner, name)
