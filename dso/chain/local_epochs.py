"""The local chain's consensus runs: incentive, emission, stake from emission, and pruning.

Epoch k runs at block k*tempo on the state after block k*tempo - 1.  Runs
whose inputs cannot differ (no registration, stake or weight change, and no
permit or voter stake moved by staked emission) give the same incentive, so
they are accrued together instead of recomputed.  After a run, rows that no
state from then on can read are pruned: superseded weights, weights of
hotkeys no longer registered, and registrations replaced by a later valid one.
"""
from __future__ import annotations

import json
import sqlite3
import threading
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dso.chain import rules
from dso.chain.base import STATE_HISTORY_BLOCKS

if TYPE_CHECKING:
    from dso.chain.local_store import LocalChainParams


@dataclass
class _Epoch:
    incentive: dict[int, tuple[str, float]]   # uid -> (hotkey, incentive)
    occupants: dict[int, tuple[str, int]]
    permits: set[int]
    voters: set[str]                          # hotkeys whose weight row counted


class EpochsMixin:
    """Consensus of :class:`dso.chain.local.LocalChain` (uses its state reads and ``params``)."""

    if TYPE_CHECKING:  # provided by LocalChain and StateMixin
        params: LocalChainParams
        _lock: threading.RLock
        _conn: sqlite3.Connection

        def block(self) -> int: ...
        def _txn(self, immediate: bool) -> AbstractContextManager[sqlite3.Connection]: ...
        def _occupants(self, conn: sqlite3.Connection, upto: int) -> dict[int, tuple[str, int]]: ...
        def _stakes(self, conn: sqlite3.Connection, upto: int,
                    accrued: dict[str, float] | None = None) -> dict[str, float]: ...
        def _permits(self, occupants: dict[int, tuple[str, int]], stakes: dict[str, float]) -> set[int]: ...
        def _latest_weights(self, conn: sqlite3.Connection, hotkey: str, upto: int,
                            since: int) -> tuple[int, dict[int, float]] | None: ...
        def _registration_valid(self, uid: Any, hotkey: Any, block: Any, signature: Any) -> bool: ...

    def _epoch(self, conn: sqlite3.Connection, upto: int, accrued: dict[str, float]) -> _Epoch:
        """Consensus over the state after block ``upto``."""
        occupants = self._occupants(conn, upto)
        stakes = self._stakes(conn, upto, accrued)
        permits = self._permits(occupants, stakes)
        uids = sorted(occupants)
        column = {uid: i for i, uid in enumerate(uids)}
        rows, row_stakes, voters = [], [], set()
        for v in sorted(permits):
            hotkey, registered = occupants[v]
            latest = self._latest_weights(conn, hotkey, upto, since=registered)
            if latest is None:
                continue
            set_at, weights = latest
            row = np.zeros(len(uids))
            for j, w in weights.items():
                # no self-weight; a weight set before uid j got its current hotkey does not count
                if j != v and j in occupants and occupants[j][1] <= set_at:
                    row[column[j]] = w
            if row.sum() > 0:
                rows.append(row / row.sum())
                row_stakes.append(stakes.get(hotkey, 0.0))
                voters.add(hotkey)
        W = np.array(rows).reshape(len(rows), len(uids))
        _, incentive = rules.yuma_consensus(W, row_stakes, self.params.kappa)
        return _Epoch({uid: (occupants[uid][0], float(incentive[column[uid]])) for uid in uids},
                      occupants, permits, voters)

    def _same_epochs_ahead(self, conn: sqlite3.Connection, upto: int, accrued: dict[str, float], epoch: _Epoch,
                           limit: int) -> int:
        """How many of the next ``limit`` epochs have the same consensus inputs as ``epoch`` when the only
        change is staked emission: none if a voter earns (its stake weight moves), else until a permit moves."""
        earning = {hk: inc for hk, inc in epoch.incentive.values() if inc > 0}
        if not earning or self.params.emission_to_stake <= 0:
            return limit
        if earning.keys() & epoch.voters:
            return 0
        per_epoch = self.params.emission_per_block * self.params.tempo
        ahead = dict(accrued)
        for n in range(limit):
            for hk, inc in earning.items():
                ahead[hk] = ahead.get(hk, 0.0) + inc * per_epoch
            if self._permits(epoch.occupants, self._stakes(conn, upto, ahead)) != epoch.permits:
                return n
        return limit

    def _process_epochs(self, conn: sqlite3.Connection) -> None:
        """Run every consensus due by now (called inside a write transaction)."""
        p = self.params
        (done,) = conn.execute("SELECT epoch FROM consensus WHERE id = 1").fetchone()
        due = self.block() // p.tempo
        if done >= due:
            return
        accrued = dict(conn.execute("SELECT hotkey, amount FROM emission").fetchall())
        before = dict(accrued)
        per_epoch = p.emission_per_block * p.tempo
        k, epoch = done + 1, None
        while k <= due:
            upto = k * p.tempo - 1
            epoch = self._epoch(conn, upto, accrued)
            (next_change,) = conn.execute(
                "SELECT MIN(b) FROM (SELECT MIN(block) AS b FROM registrations WHERE block > ?1 UNION ALL "
                "SELECT MIN(block) FROM stake_log WHERE block > ?1 UNION ALL "
                "SELECT MIN(block) FROM weights WHERE block > ?1)", (upto,)).fetchone()
            last = due if next_change is None else min(due, next_change // p.tempo)
            last = k + self._same_epochs_ahead(conn, upto, accrued, epoch, last - k)
            for hk, inc in epoch.incentive.values():
                if inc > 0:
                    accrued[hk] = accrued.get(hk, 0.0) + inc * per_epoch * (last - k + 1)
            k = last + 1
        assert epoch is not None  # done < due, so the loop ran at least once
        conn.executemany("INSERT INTO emission VALUES (?1, ?2) ON CONFLICT(hotkey) DO UPDATE SET amount = ?2",
                         [(hk, amount) for hk, amount in accrued.items() if before.get(hk) != amount])
        conn.execute("UPDATE consensus SET epoch = ?, incentive = ? WHERE id = 1",
                     (due, json.dumps({str(u): [hk, inc] for u, (hk, inc) in epoch.incentive.items()})))
        self._prune(conn, due * p.tempo - 1 - STATE_HISTORY_BLOCKS)  # recent state stays readable by block

    def _prune(self, conn: sqlite3.Connection, cutoff: int) -> None:
        """Delete rows no state after block ``cutoff`` can read (every later read is as of >= cutoff)."""
        conn.execute("DELETE FROM weights WHERE block <= ?1 AND id NOT IN "
                     "(SELECT MAX(id) FROM weights WHERE block <= ?1 GROUP BY hotkey)", (cutoff,))
        occupants = self._occupants(conn, cutoff)
        registered = {hk for hk, _ in occupants.values()}
        # a hotkey that registers again only reads weights posted since: its old rows are dead
        stale = [hk for (hk,) in conn.execute("SELECT DISTINCT hotkey FROM weights WHERE block <= ?", (cutoff,))
                 if hk not in registered]
        conn.executemany("DELETE FROM weights WHERE hotkey = ? AND block <= ?", [(hk, cutoff) for hk in stale])
        # a registration is dead once a later valid one took its uid or moved its hotkey; forged rows are dead
        live = {(uid, hk, reg) for uid, (hk, reg) in occupants.items()}
        dead = [row_id for row_id, uid, hk, block, signature in conn.execute(
                    "SELECT id, uid, hotkey, block, signature FROM registrations WHERE block <= ?", (cutoff,))
                if (uid, hk, block) not in live or not self._registration_valid(uid, hk, block, signature)]
        conn.executemany("DELETE FROM registrations WHERE id = ?", [(i,) for i in dead])

    def _ensure_epochs(self) -> None:
        with self._lock:
            (done,) = self._conn.execute("SELECT epoch FROM consensus WHERE id = 1").fetchone()
        if done < self.block() // self.params.tempo:
            with self._txn(immediate=True):
                pass
