"""What a registration costs on the local chain: a burn priced as subtensor prices it, paid from a balance.

The real chain's burned registration (``burned_register``) takes the subnet's current burn from the
registrant's balance and recycles it.  The burn moves on its own: it halves once every ``BurnHalfLife``
blocks and is multiplied by ``BurnIncreaseMult`` after each registration, kept within ``[MinBurn,
MaxBurn]``.  So one registration costs about the burn, a flood of them costs more with every one, and the
price falls back once the flood stops.  :class:`BurnMixin` keeps the same rule in the chain file: the price
as of the last halving, and free balances per hotkey (an administrative ``fund``, like stake).  Differences
from the real chain are in docs/chain.md.
"""
from __future__ import annotations

import math
import sqlite3
import threading
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from dso.chain import rules
from dso.chain.base import ChainError
from dso.chain.wallets import is_valid_address

if TYPE_CHECKING:
    from dso.chain.local_store import LocalChainParams

# Added after schema version 1: created on open when missing, so older chain files gain them.
BURN_SCHEMA = """
CREATE TABLE IF NOT EXISTS balance_log (id INTEGER PRIMARY KEY AUTOINCREMENT, account TEXT NOT NULL,
    block INTEGER NOT NULL, delta REAL NOT NULL, reason TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS balance_by_account ON balance_log(account);
CREATE TABLE IF NOT EXISTS burn (id INTEGER PRIMARY KEY CHECK (id = 1), price REAL NOT NULL,
    halved_at INTEGER NOT NULL);
"""

# Chain settings under which a registration burns nothing: for tests of other rules and tools that register
# wallets they create themselves.  A local network funds its wallets instead (sim/localnet.py).
FREE_REGISTRATION: dict[str, float] = {"burn_initial": 0.0, "burn_min": 0.0}


def burn_price(stored: float, halved_at: int, block: int, params: LocalChainParams) -> tuple[float, int]:
    """(price at ``block``, block of the last halving by then) from the price stored at ``halved_at``: halved
    once per ``burn_half_life`` blocks passed, then kept within [burn_min, burn_max] (subtensor's rule)."""
    halvings = (block - halved_at) // params.burn_half_life if block > halved_at else 0
    price = stored * 0.5 ** min(halvings, 1100)  # 2^-1100 is 0.0 in a double: no underflow error
    return clamp_burn(price, params), halved_at + halvings * params.burn_half_life


def clamp_burn(price: float, params: LocalChainParams) -> float:
    return min(params.burn_max, max(params.burn_min, price))


class BurnMixin:
    """Balances and the registration burn of :class:`dso.chain.local.LocalChain`."""

    if TYPE_CHECKING:  # provided by LocalChain
        params: LocalChainParams
        _lock: threading.RLock
        _conn: sqlite3.Connection

        def block(self) -> int: ...
        def _txn(self, immediate: bool) -> AbstractContextManager[sqlite3.Connection]: ...

    @staticmethod
    def _balance(conn: sqlite3.Connection, account: str) -> float:
        (total,) = conn.execute("SELECT COALESCE(SUM(delta), 0) FROM balance_log WHERE account = ?",
                                (account,)).fetchone()
        return float(total)

    def _price(self, conn: sqlite3.Connection, block: int) -> tuple[float, int]:
        row = conn.execute("SELECT price, halved_at FROM burn WHERE id = 1").fetchone()
        # before the first registration the price is burn_initial, wherever the chain's clock stands
        stored, halved_at = (self.params.burn_initial, block) if row is None else (float(row[0]), int(row[1]))
        return burn_price(stored, halved_at, block, self.params)

    def _burn_for_registration(self, conn: sqlite3.Connection, hotkey: str, block: int) -> float:
        """Take the current burn from ``hotkey``'s balance and raise the price for the next registrant; the amount
        burned.  ChainError ``insufficient_balance`` (nothing written) when the hotkey cannot pay."""
        price, halved_at = self._price(conn, block)
        held = self._balance(conn, hotkey)
        if held < price:
            raise ChainError(rules.INSUFFICIENT_BALANCE,
                             f"registration burns {price:.6g} now; hotkey {hotkey} holds {held:.6g} (fund it with "
                             f"`python -m dso.chain fund --hotkey {hotkey} --amount {math.ceil(price):g}`)")
        if price > 0:
            conn.execute("INSERT INTO balance_log (account, block, delta, reason) VALUES (?, ?, ?, 'burn')",
                         (hotkey, block, -price))
        conn.execute("INSERT INTO burn VALUES (1, ?1, ?2) ON CONFLICT(id) DO UPDATE SET price = ?1, halved_at = ?2",
                     (clamp_burn(price * self.params.burn_increase_mult, self.params), halved_at))
        return price

    # ------------------------------------------------- local-only operations
    def registration_burn(self) -> float:
        """What a registration burns at the current block."""
        with self._txn(immediate=False) as conn:
            return self._price(conn, self.block())[0]

    def balance(self, account: str) -> float:
        """The free balance of ``account`` (an ss58 hotkey)."""
        with self._txn(immediate=False) as conn:
            return self._balance(conn, account)

    def fund(self, account: str, amount: Any) -> float:
        """Admin funding of the local network (negative = take back, never below zero); the new balance."""
        if not is_valid_address(account):
            raise ChainError(rules.BAD_INPUT, f"not an ss58 address: {account!r}")
        if not rules.is_real(amount) or not math.isfinite(amount):
            raise ChainError(rules.BAD_INPUT, f"amount must be a finite number, got {amount!r}")
        with self._txn(immediate=True) as conn:
            held = self._balance(conn, account)
            if held + amount < 0:
                raise ChainError(rules.BAD_INPUT, f"cannot take {-amount:g}: {account} holds {held:g}")
            conn.execute("INSERT INTO balance_log (account, block, delta, reason) VALUES (?, ?, ?, 'fund')",
                         (account, self.block(), float(amount)))
            return held + float(amount)
