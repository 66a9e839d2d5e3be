"""The provenance ledger of the local chain: append-only, hash-linked, signed records.

Record i stores ``prev_hash`` (record i-1's hash, or 64 zeros) and
``hash = sha256(prev_hash || canonical JSON of the record)``; the writer's
hotkey signs (seq, prev_hash, hash).  Rewriting any record breaks its hash or
the next link, and a row written without the hotkey's key fails its signature;
:meth:`LedgerMixin.verify_ledger` names each problem.  (Cutting records off the
end is detectable only against a hash published elsewhere, e.g. in S3.)
"""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from dso.chain import rules
from dso.chain.base import ChainError

if TYPE_CHECKING:
    from dso.chain.local_store import LocalChainParams


class LedgerMixin:
    """Ledger operations of :class:`dso.chain.local.LocalChain` (uses its transaction and signing helpers)."""

    if TYPE_CHECKING:  # provided by LocalChain and StateMixin
        params: LocalChainParams

        def _hotkey(self, wallet: Any) -> str: ...
        def _txn(self, immediate: bool) -> AbstractContextManager[sqlite3.Connection]: ...
        def block(self) -> int: ...
        def _require_uid(self, conn: sqlite3.Connection, hotkey: str,
                         now: int) -> tuple[int, dict[int, tuple[str, int]]]: ...
        def _signed(self, wallet: Any, op: str, block: int, **fields: Any) -> tuple[str, str]: ...
        def _row_valid(self, key: tuple[Any, ...], hotkey: Any, signature: Any,
                       message: Callable[[], bytes]) -> bool: ...
        def _message(self, op: str, hotkey: str, block: int, **fields: Any) -> bytes: ...

    def append_ledger(self, wallet: Any, record: dict[str, Any]) -> str:
        """Append a provenance record signed by a registered hotkey; returns its hash."""
        if not isinstance(record, dict):
            raise ChainError(rules.BAD_RECORD, f"a ledger record must be a JSON object, got {type(record).__name__}")
        try:
            blob = rules.canonical_json(record)
        except (ValueError, TypeError) as e:
            raise ChainError(rules.BAD_RECORD, f"ledger record is not plain JSON: {e}") from None
        if len(blob) > self.params.ledger_max_bytes:
            raise ChainError(rules.TOO_LARGE,
                             f"ledger record is {len(blob)} bytes; limit {self.params.ledger_max_bytes}")
        hotkey = self._hotkey(wallet)
        with self._txn(immediate=True) as conn:
            now = self.block()
            self._require_uid(conn, hotkey, now)
            last = conn.execute("SELECT seq, hash FROM ledger ORDER BY seq DESC LIMIT 1").fetchone()
            seq, prev = (0, rules.GENESIS_HASH) if last is None else (last[0] + 1, last[1])
            digest = rules.ledger_hash(prev, record)
            _, signature = self._signed(wallet, "ledger", now, seq=seq, prev_hash=prev, hash=digest)
            conn.execute("INSERT INTO ledger VALUES (?, ?, ?, ?, ?, ?, ?)",
                         (seq, now, hotkey, prev, digest, blob.decode("ascii"), signature))
            return digest

    def _ledger_rows(self) -> list[tuple[Any, ...]]:
        with self._txn(immediate=False) as conn:
            return conn.execute("SELECT seq, block, hotkey, prev_hash, hash, record, signature FROM ledger "
                                "ORDER BY seq").fetchall()

    def _ledger_problem(self, row: tuple[Any, ...], expected_seq: int, expected_prev: str) -> str | None:
        seq, block, hotkey, prev, digest, text, signature = row
        if seq != expected_seq:
            return f"seq {seq}: expected seq {expected_seq} (records missing)"
        if prev != expected_prev:
            return f"seq {seq}: prev_hash does not link to the previous record"
        try:
            if rules.ledger_hash(prev, json.loads(text)) != digest:
                return f"seq {seq}: content does not match its hash"
        except (ValueError, TypeError):
            return f"seq {seq}: record is not valid JSON"
        if not self._row_valid(("ledger", seq, block, hotkey, prev, digest, signature), hotkey, signature,
                               lambda: self._message("ledger", hotkey, block, seq=seq, prev_hash=prev, hash=digest)):
            return f"seq {seq}: signature is not {hotkey}'s"
        return None

    def ledger(self) -> list[dict[str, Any]]:
        """Records whose hash and signature check out, in order: {seq, block, hotkey, prev_hash, hash, record}."""
        out = []
        for row in self._ledger_rows():
            if self._ledger_problem(row, row[0], row[3]) is None:
                seq, block, hotkey, prev, digest, text, _ = row
                out.append({"seq": seq, "block": block, "hotkey": hotkey, "prev_hash": prev, "hash": digest,
                            "record": json.loads(text)})
        return out

    def verify_ledger(self) -> list[str]:
        """Problems found walking the hash chain from the genesis hash; an empty list means intact."""
        problems, prev, expected_seq = [], rules.GENESIS_HASH, 0
        for row in self._ledger_rows():
            problem = self._ledger_problem(row, expected_seq, prev)
            if problem:
                problems.append(problem)
            prev, expected_seq = row[4], row[0] + 1
        return problems
