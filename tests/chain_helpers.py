"""Helpers shared by the chain tests (imported by module name: tests/ is on sys.path under pytest)."""
from __future__ import annotations

from dso.chain.wallets import dev_wallet, hotkey_address


class FakeClock:
    """Wall time that only moves when a test says so (block = floor(t / block_time) with genesis 0)."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance_blocks(self, n: int, block_time: float = 1.0) -> None:
        self.t += n * block_time


def wallets(prefix: str, n: int) -> list:
    """n development wallets //<prefix>0 ... //<prefix>{n-1}: deterministic, no files."""
    return [dev_wallet(f"//{prefix}{i}") for i in range(n)]


def hk(wallet) -> str:
    return hotkey_address(wallet)
