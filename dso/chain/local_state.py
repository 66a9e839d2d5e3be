"""Reading the local chain's state as of a block, with each signed row verified once.

Every row was signed by its hotkey (see :mod:`dso.chain.local`); a row that
fails its signature is ignored.  Verifying costs ~0.1 ms and rebuilding the
signed message for the check costs about as much again, so both are done
once per row per process: the cache is keyed by the row's raw column values
(no JSON, no hashing on a hit), hence a row edited in place in the file is a
new key and is checked afresh.
"""
from __future__ import annotations

import functools
import json
import sqlite3
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dso.chain import rules
from dso.chain.base import ChainError
from dso.chain.wallets import verify

if TYPE_CHECKING:
    from dso.chain.local_store import LocalChainParams

_VERIFIED_CAP = 500_000  # rows remembered (pruning keeps the live tables far smaller)


class StateMixin:
    """State reads of :class:`dso.chain.local.LocalChain` (uses its ``params``, ``_message``)."""

    if TYPE_CHECKING:  # provided by LocalChain
        params: LocalChainParams

        def _message(self, op: str, hotkey: str, block: int, **fields: Any) -> bytes: ...

    def _init_state(self) -> None:
        self._verified: OrderedDict[tuple[Any, ...], bool] = OrderedDict()

    def _row_valid(self, key: tuple[Any, ...], hotkey: Any, signature: Any, message: Callable[[], bytes]) -> bool:
        """Whether a stored row's signature is its hotkey's, verified on first sight only."""
        known = self._verified.get(key)
        if known is None:
            try:
                known = isinstance(hotkey, str) and isinstance(signature, str) and verify(hotkey, message(), signature)
            except (ValueError, TypeError, ChainError):
                known = False
            self._verified[key] = known
            if len(self._verified) > _VERIFIED_CAP:
                self._verified.popitem(last=False)
        return known

    def _registration_valid(self, uid: Any, hotkey: Any, block: Any, signature: Any) -> bool:
        return rules.is_int(uid) and 0 <= uid < self.params.max_uids and self._row_valid(
            ("register", uid, hotkey, block, signature), hotkey, signature,
            lambda: self._message("register", hotkey, block, uid=uid))

    def _occupants(self, conn: sqlite3.Connection, upto: int) -> dict[int, tuple[str, int]]:
        """uid -> (hotkey, registration block) after block ``upto``; forged rows are skipped."""
        occupant: dict[int, tuple[str, int]] = {}
        uid_of: dict[str, int] = {}
        rows = conn.execute("SELECT uid, hotkey, block, signature FROM registrations WHERE block <= ? "
                            "ORDER BY id", (upto,))
        for uid, hotkey, block, signature in rows:
            if not self._registration_valid(uid, hotkey, block, signature):
                continue
            if uid in occupant:
                uid_of.pop(occupant[uid][0], None)
            if hotkey in uid_of:  # one uid per hotkey: its latest registration wins
                occupant.pop(uid_of[hotkey])
            occupant[uid], uid_of[hotkey] = (hotkey, block), uid
        return occupant

    def _stakes(self, conn: sqlite3.Connection, upto: int, accrued: dict[str, float] | None = None) -> dict[str, float]:
        """Stake per hotkey after ``upto``: admin stake, plus ``emission_to_stake`` of the emission it has
        accrued (``accrued``: the epoch loop's running totals; None = as stored)."""
        rows = conn.execute("SELECT hotkey, SUM(delta) FROM stake_log WHERE block <= ? GROUP BY hotkey", (upto,))
        stakes = {hotkey: max(0.0, total) for hotkey, total in rows}
        share = self.params.emission_to_stake
        if share > 0:
            if accrued is None:
                accrued = dict(conn.execute("SELECT hotkey, amount FROM emission").fetchall())
            for hotkey, amount in accrued.items():
                stakes[hotkey] = stakes.get(hotkey, 0.0) + share * amount
        return stakes

    def _permits(self, occupants: dict[int, tuple[str, int]], stakes: dict[str, float]) -> set[int]:
        by_uid = {uid: stakes.get(hotkey, 0.0) for uid, (hotkey, _) in occupants.items()}
        return rules.validator_permits(by_uid, self.params.max_validators, self.params.min_validator_stake)

    def _weights_valid(self, hotkey: str, block: int, uids_json: Any, weights_json: Any, signature: Any) -> bool:
        def message() -> bytes:
            return self._message("weights", hotkey, block, uids=json.loads(uids_json), weights=json.loads(weights_json))
        return self._row_valid(("weights", hotkey, block, uids_json, weights_json, signature), hotkey, signature,
                               message)

    def _latest_weights(self, conn: sqlite3.Connection, hotkey: str, upto: int,
                        since: int) -> tuple[int, dict[int, float]] | None:
        """(block, normalised and clipped row) of the hotkey's latest valid post in [since, upto]."""
        rows = conn.execute("SELECT block, uids, weights, signature FROM weights WHERE hotkey = ? AND block <= ? "
                            "AND block >= ? ORDER BY block DESC, id DESC", (hotkey, upto, since))
        for block, uids_json, weights_json, signature in rows:
            if not self._weights_valid(hotkey, block, uids_json, weights_json, signature):
                continue
            try:
                row = rules.normalise_weights(json.loads(uids_json), json.loads(weights_json),
                                              n_uids=self.params.max_uids)
            except (ValueError, TypeError, ChainError):
                continue
            if self.params.max_weight_limit < 1:
                row = rules.clip_max_weight(row, self.params.max_weight_limit)
            return block, row
        return None

    def _latest_commitment(self, conn: sqlite3.Connection, hotkey: str, upto: int) -> tuple[int, str] | None:
        rows = conn.execute("SELECT block, data, signature FROM commitments WHERE hotkey = ? AND block <= ? "
                            "ORDER BY block DESC, id DESC", (hotkey, upto))
        for block, data, signature in rows:
            message = functools.partial(self._message, "commit", hotkey, block, data=data)
            if isinstance(data, str) and self._row_valid(("commit", hotkey, block, data, signature), hotkey,
                                                         signature, message):
                return block, data
        return None

    @staticmethod
    def _incentive(conn: sqlite3.Connection) -> dict[int, tuple[str, float]]:
        (text,) = conn.execute("SELECT incentive FROM consensus WHERE id = 1").fetchone()
        return {int(uid): (hotkey, float(value)) for uid, (hotkey, value) in json.loads(text).items()}
