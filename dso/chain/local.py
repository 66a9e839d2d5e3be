"""LocalChain: the embedded chain every process of a local network shares through one SQLite file.

Time: block b starts at ``genesis + b * block_time`` (so all processes agree
without talking).  State is a set of append-mostly logs stamped with the block
they were written in — registrations, stake changes, commitments, weights,
ledger — so "the state at block x" is a query, and the lazily computed
consensus of each tempo is the same whoever computes it and whenever.

Every write is signed by the wallet's hotkey and verified twice: on write
(a process cannot write as another) and on read (a row inserted into the file
directly, without the hotkey's key, is ignored).  Writers serialise with
``BEGIN IMMEDIATE`` + a busy timeout in WAL mode; SQLite's journal makes each
write atomic, so a killed writer never leaves a half-written state.
Rules and their reasons are in docs/chain.md.
"""
from __future__ import annotations

import hashlib
import json
import math
import secrets
import sqlite3
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from dso.chain import rules
from dso.chain.base import Chain, ChainError, ChainUnavailable, Neuron
from dso.chain.local_ledger import LedgerMixin
from dso.chain.local_store import LocalChainParams, check_block, connect, create_file, params_from
from dso.chain.wallets import WalletError, hotkey_address, is_valid_address, sign, verify

_DOMAIN = b"dso-localchain/v1:"  # signatures made for this chain never verify elsewhere
_KEEP_COMMITMENTS = 4            # history kept per hotkey (only the latest valid one is read)


class LocalChain(LedgerMixin, Chain):
    """One subnet in a SQLite file.  Create with :meth:`create`, attach with :meth:`open`."""

    def __init__(self, path: Path, conn: sqlite3.Connection, params: LocalChainParams, chain_id: str,
                 clock: Callable[[], float]):
        self.path, self.params, self.chain_id = path, params, chain_id
        self._conn, self._clock = conn, clock
        self._lock = threading.RLock()
        self._verified: OrderedDict[tuple, bool] = OrderedDict()  # signature checks are ~0.1 ms each

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def create(cls, path: str | Path, *, exist_ok: bool = False, clock: Callable[[], float] = time.time,
               **settings: Any) -> "LocalChain":
        """Create a chain file with the given :class:`LocalChainParams` fields (genesis defaults to now).

        The file appears atomically, fully initialised.  If it exists: open it
        (its own parameters win) when ``exist_ok``, else ChainError('exists').
        """
        path = Path(path).expanduser()
        if not (exist_ok and path.exists()):
            if settings.get("genesis") is None:
                settings["genesis"] = clock()
            try:
                create_file(path, params_from(settings))
            except ChainError as e:
                if not (exist_ok and e.reason == "exists"):
                    raise
        return cls.open(path, clock=clock)

    @classmethod
    def open(cls, path: str | Path, *, clock: Callable[[], float] = time.time) -> "LocalChain":
        """Attach to an existing chain file; ChainUnavailable (saying how to start one) if absent."""
        path = Path(path).expanduser()
        conn, params, chain_id = connect(path)
        return cls(path, conn, params, chain_id, clock)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __repr__(self) -> str:
        return f"LocalChain({str(self.path)!r}, block_time={self.params.block_time}, tempo={self.params.tempo})"

    @contextmanager
    def _txn(self, immediate: bool) -> Iterator[sqlite3.Connection]:
        """A transaction; a write one (``immediate``) first runs any consensus that is due."""
        with self._lock:
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
            except sqlite3.Error as e:
                raise ChainUnavailable(f"local chain {self.path}: {e}") from None
            try:
                if immediate:
                    self._process_epochs(conn)
                yield conn
                conn.execute("COMMIT")
            except BaseException as e:
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                if isinstance(e, sqlite3.Error):
                    raise ChainUnavailable(f"local chain {self.path}: {e}") from None
                raise

    # ------------------------------------------------------------- signing
    def _message(self, op: str, hotkey: str, block: int, **fields: Any) -> bytes:
        body = {"chain": self.chain_id, "op": op, "hotkey": hotkey, "block": block, **fields}
        return _DOMAIN + rules.canonical_json(body)

    def _valid(self, hotkey: str, message: bytes, signature: str) -> bool:
        key = (hotkey, hashlib.sha256(message).digest(), signature)
        if key not in self._verified:
            self._verified[key] = verify(hotkey, message, signature)
            if len(self._verified) > 20_000:
                self._verified.popitem(last=False)
        return self._verified[key]

    def _signed(self, wallet: Any, op: str, block: int, **fields: Any) -> tuple[str, str]:
        """(hotkey, signature) for a write; refuses a wallet that cannot sign for its claimed hotkey."""
        try:
            hotkey = hotkey_address(wallet)
            message = self._message(op, hotkey, block, **fields)
            signature = sign(wallet, message)
        except WalletError as e:
            raise ChainError(rules.BAD_SIGNATURE, str(e)) from None
        if not is_valid_address(hotkey) or not self._valid(hotkey, message, signature):
            raise ChainError(rules.BAD_SIGNATURE,
                             f"signature does not match hotkey {hotkey}: no process can write as another")
        return hotkey, signature

    @staticmethod
    def _hotkey(wallet: Any) -> str:
        try:
            return hotkey_address(wallet)
        except WalletError as e:
            raise ChainError(rules.BAD_INPUT, str(e)) from None

    # ------------------------------------------------------ state at a block
    def _occupants(self, conn: sqlite3.Connection, upto: int) -> dict[int, tuple[str, int]]:
        """uid -> (hotkey, registration block) after block ``upto``; forged rows are skipped."""
        occupant: dict[int, tuple[str, int]] = {}
        uid_of: dict[str, int] = {}
        rows = conn.execute("SELECT uid, hotkey, block, signature FROM registrations WHERE block <= ? "
                            "ORDER BY id", (upto,))
        for uid, hotkey, block, signature in rows:
            if not (isinstance(uid, int) and 0 <= uid < self.params.max_uids and isinstance(signature, str)) or \
                    not self._valid(hotkey, self._message("register", hotkey, block, uid=uid), signature):
                continue
            if uid in occupant:
                uid_of.pop(occupant[uid][0], None)
            if hotkey in uid_of:  # one uid per hotkey: its latest registration wins
                occupant.pop(uid_of[hotkey])
            occupant[uid], uid_of[hotkey] = (hotkey, block), uid
        return occupant

    @staticmethod
    def _stakes(conn: sqlite3.Connection, upto: int) -> dict[str, float]:
        rows = conn.execute("SELECT hotkey, SUM(delta) FROM stake_log WHERE block <= ? GROUP BY hotkey", (upto,))
        return {hotkey: max(0.0, total) for hotkey, total in rows}

    def _permits(self, occupants: dict[int, tuple[str, int]], stakes: dict[str, float]) -> set[int]:
        by_uid = {uid: stakes.get(hotkey, 0.0) for uid, (hotkey, _) in occupants.items()}
        return rules.validator_permits(by_uid, self.params.max_validators, self.params.min_validator_stake)

    def _latest_weights(self, conn, hotkey: str, upto: int, since: int) -> tuple[int, dict[int, float]] | None:
        rows = conn.execute("SELECT block, uids, weights, signature FROM weights WHERE hotkey = ? AND block <= ? "
                            "AND block >= ? ORDER BY block DESC, id DESC", (hotkey, upto, since))
        for block, uids_json, weights_json, signature in rows:
            try:
                uids, weights = json.loads(uids_json), json.loads(weights_json)
                message = self._message("weights", hotkey, block, uids=uids, weights=weights)
                if self._valid(hotkey, message, signature):
                    return block, rules.normalise_weights(uids, weights, n_uids=self.params.max_uids)
            except (ValueError, TypeError, ChainError):
                continue
        return None

    def _latest_commitment(self, conn, hotkey: str, upto: int) -> tuple[int, str] | None:
        rows = conn.execute("SELECT block, data, signature FROM commitments WHERE hotkey = ? AND block <= ? "
                            "ORDER BY block DESC, id DESC", (hotkey, upto))
        for block, data, signature in rows:
            if isinstance(data, str) and self._valid(hotkey, self._message("commit", hotkey, block, data=data),
                                                     signature):
                return block, data
        return None

    @staticmethod
    def _incentive(conn) -> dict[int, tuple[str, float]]:
        (text,) = conn.execute("SELECT incentive FROM consensus WHERE id = 1").fetchone()
        return {int(uid): (hotkey, float(value)) for uid, (hotkey, value) in json.loads(text).items()}

    # ----------------------------------------------------------- consensus
    def _epoch_incentive(self, conn, upto: int) -> dict[int, tuple[str, float]]:
        """Consensus over the state after block ``upto``: uid -> (hotkey, incentive)."""
        occupants = self._occupants(conn, upto)
        stakes = self._stakes(conn, upto)
        uids = sorted(occupants)
        column = {uid: i for i, uid in enumerate(uids)}
        rows, row_stakes = [], []
        for v in sorted(self._permits(occupants, stakes)):
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
        W = np.array(rows).reshape(len(rows), len(uids))
        _, incentive = rules.yuma_consensus(W, row_stakes, self.params.kappa)
        return {uid: (occupants[uid][0], float(incentive[column[uid]])) for uid in uids}

    def _process_epochs(self, conn) -> None:
        """Run every consensus due up to now (inside a write transaction; idempotent).

        Epoch k runs at block k*tempo on the state after block k*tempo - 1.  Runs
        with no registration, stake or weight change in between give the same
        result, so they are accrued together instead of recomputed.
        """
        p = self.params
        (done,) = conn.execute("SELECT epoch FROM consensus WHERE id = 1").fetchone()
        due = self.block() // p.tempo
        if done >= due:
            return
        k, incentive = done + 1, {}
        while k <= due:
            upto = k * p.tempo - 1
            incentive = self._epoch_incentive(conn, upto)
            (next_change,) = conn.execute(
                "SELECT MIN(b) FROM (SELECT MIN(block) AS b FROM registrations WHERE block > ?1 UNION ALL "
                "SELECT MIN(block) FROM stake_log WHERE block > ?1 UNION ALL "
                "SELECT MIN(block) FROM weights WHERE block > ?1)", (upto,)).fetchone()
            last = due if next_change is None else min(due, next_change // p.tempo)
            per_epoch = p.emission_per_block * p.tempo
            conn.executemany(
                "INSERT INTO emission VALUES (?1, ?2) ON CONFLICT(hotkey) DO UPDATE SET amount = amount + ?2",
                [(hk, inc * per_epoch * (last - k + 1)) for hk, inc in incentive.values() if inc > 0])
            k = last + 1
        conn.execute("UPDATE consensus SET epoch = ?, incentive = ? WHERE id = 1",
                     (due, json.dumps({str(u): [hk, inc] for u, (hk, inc) in incentive.items()})))
        # weights superseded before the last run can never be read again
        cutoff = due * p.tempo - 1
        conn.execute("DELETE FROM weights WHERE block <= ?1 AND id NOT IN "
                     "(SELECT MAX(id) FROM weights WHERE block <= ?1 GROUP BY hotkey)", (cutoff,))

    def _ensure_epochs(self) -> None:
        with self._lock:
            (done,) = self._conn.execute("SELECT epoch FROM consensus WHERE id = 1").fetchone()
        if done < self.block() // self.params.tempo:
            with self._txn(immediate=True):
                pass

    # ----------------------------------------------------------- Chain API
    def block(self) -> int:
        return max(0, math.floor((self._clock() - self.params.genesis) / self.params.block_time))

    def block_timestamp(self, block: int) -> float:
        return self.params.genesis + check_block(block) * self.params.block_time

    def randomness(self, block: int) -> bytes:
        """32 random bytes drawn by the first process that asks once ``block`` exists, then fixed."""
        block = check_block(block)
        if block > self.block():
            raise ChainError(rules.FUTURE_BLOCK, f"block {block} is not produced yet (now {self.block()})")
        with self._txn(immediate=False) as conn:
            row = conn.execute("SELECT value FROM randomness WHERE block = ?", (block,)).fetchone()
        if row is None:
            with self._txn(immediate=True) as conn:
                conn.execute("INSERT OR IGNORE INTO randomness VALUES (?, ?)", (block, secrets.token_bytes(32)))
                row = conn.execute("SELECT value FROM randomness WHERE block = ?", (block,)).fetchone()
        return bytes(row[0])

    def metagraph(self) -> list[Neuron]:
        self._ensure_epochs()
        with self._txn(immediate=False) as conn:
            now = self.block()
            occupants, stakes = self._occupants(conn, now), self._stakes(conn, now)
            permits = self._permits(occupants, stakes)
            incentive = self._incentive(conn)
            emission = dict(conn.execute("SELECT hotkey, amount FROM emission").fetchall())
        out = []
        for uid in sorted(occupants):
            hotkey = occupants[uid][0]
            inc_hotkey, inc = incentive.get(uid, (None, 0.0))
            out.append(Neuron(uid=uid, hotkey=hotkey, stake=stakes.get(hotkey, 0.0),
                              validator_permit=uid in permits, incentive=inc if inc_hotkey == hotkey else 0.0,
                              emission=emission.get(hotkey, 0.0)))
        return out

    def register(self, wallet: Any) -> int:
        hotkey = self._hotkey(wallet)
        with self._txn(immediate=True) as conn:
            now = self.block()
            occupants = self._occupants(conn, now)
            for uid, (held_by, _) in occupants.items():
                if held_by == hotkey:
                    return uid
            uid = next((u for u in range(self.params.max_uids) if u not in occupants), None)
            if uid is None:
                incentive = self._incentive(conn)

                def last_incentive(u: int, hk: str) -> float:
                    held_by, value = incentive.get(u, ("", 0.0))
                    return value if held_by == hk else 0.0
                uid = rules.pick_eviction([(u, last_incentive(u, hk), reg) for u, (hk, reg) in occupants.items()],
                                          now, self.params.immunity_blocks)
                if uid is None:
                    first = min(reg for _, reg in occupants.values()) + self.params.immunity_blocks
                    raise ChainError(rules.SUBNET_FULL, f"all {self.params.max_uids} uids are taken and still "
                                                        f"immune; the first becomes replaceable at block {first}")
            _, signature = self._signed(wallet, "register", now, uid=uid)
            conn.execute("INSERT INTO registrations (uid, hotkey, block, signature) VALUES (?, ?, ?, ?)",
                         (uid, hotkey, now, signature))
            conn.execute("DELETE FROM emission WHERE hotkey = ?", (hotkey,))  # a new registration starts at 0
            return uid

    def _require_uid(self, conn, hotkey: str, now: int) -> tuple[int, dict[int, tuple[str, int]]]:
        occupants = self._occupants(conn, now)
        uid = next((u for u, (hk, _) in occupants.items() if hk == hotkey), None)
        if uid is None:
            raise ChainError(rules.NOT_REGISTERED, f"hotkey {hotkey} is not registered on this chain")
        return uid, occupants

    def commit(self, wallet: Any, data: str) -> None:
        data = rules.check_commitment(data, self.params.commit_max_bytes)
        hotkey = self._hotkey(wallet)
        with self._txn(immediate=True) as conn:
            now = self.block()
            self._require_uid(conn, hotkey, now)
            latest = self._latest_commitment(conn, hotkey, now)
            if latest is not None and latest[1] == data:
                return  # unchanged: nothing to write, no rate limit spent
            if latest is not None and now - latest[0] < self.params.commit_interval_blocks:
                raise ChainError(rules.RATE_LIMITED, f"one commitment per {self.params.commit_interval_blocks} "
                                 f"blocks; next allowed at block {latest[0] + self.params.commit_interval_blocks}")
            _, signature = self._signed(wallet, "commit", now, data=data)
            conn.execute("INSERT INTO commitments (hotkey, block, data, signature) VALUES (?, ?, ?, ?)",
                         (hotkey, now, data, signature))
            conn.execute("DELETE FROM commitments WHERE hotkey = ?1 AND id NOT IN (SELECT id FROM commitments "
                         "WHERE hotkey = ?1 ORDER BY id DESC LIMIT ?2)", (hotkey, _KEEP_COMMITMENTS))

    def commitments(self) -> dict[int, str]:
        with self._txn(immediate=False) as conn:
            now = self.block()
            out = {}
            for uid, (hotkey, _) in sorted(self._occupants(conn, now).items()):
                latest = self._latest_commitment(conn, hotkey, now)
                if latest is not None:
                    out[uid] = latest[1]
            return out

    def set_weights(self, wallet: Any, uids: list[int], weights: list[float]) -> None:
        normalised = rules.normalise_weights(uids, weights, n_uids=self.params.max_uids)
        hotkey = self._hotkey(wallet)
        with self._txn(immediate=True) as conn:
            now = self.block()
            uid, occupants = self._require_uid(conn, hotkey, now)
            stakes = self._stakes(conn, now)
            if uid not in self._permits(occupants, stakes):
                raise ChainError(rules.NO_PERMIT, f"uid {uid} has no validator permit: stake "
                                 f"{stakes.get(hotkey, 0.0):g}, needs >= {self.params.min_validator_stake:g} "
                                 f"and a top-{self.params.max_validators} stake")
            unknown = sorted(u for u in normalised if u not in occupants)
            if unknown:
                raise ChainError(rules.BAD_WEIGHTS, f"uids {unknown} are not registered")
            raw_uids, raw_weights = [int(u) for u in uids], [float(w) for w in weights]
            _, signature = self._signed(wallet, "weights", now, uids=raw_uids, weights=raw_weights)
            conn.execute("INSERT INTO weights (hotkey, block, uids, weights, signature) VALUES (?, ?, ?, ?, ?)",
                         (hotkey, now, json.dumps(raw_uids), json.dumps(raw_weights), signature))

    def weights(self) -> dict[int, dict[int, float]]:
        with self._txn(immediate=False) as conn:
            now = self.block()
            out = {}
            for uid, (hotkey, registered) in sorted(self._occupants(conn, now).items()):
                latest = self._latest_weights(conn, hotkey, now, since=registered)
                if latest is not None:
                    out[uid] = latest[1]
            return out

    # ------------------------------------------------- local-only operations
    def add_stake(self, hotkey: str, amount: float) -> float:
        """Admin funding of the local network (negative = unstake); returns the hotkey's new stake."""
        if not is_valid_address(hotkey):
            raise ChainError(rules.BAD_INPUT, f"not an ss58 address: {hotkey!r}")
        if not rules.is_real(amount) or not math.isfinite(amount):
            raise ChainError(rules.BAD_INPUT, f"stake amount must be a finite number, got {amount!r}")
        with self._txn(immediate=True) as conn:
            (current,) = conn.execute("SELECT COALESCE(SUM(delta), 0) FROM stake_log WHERE hotkey = ?",
                                      (hotkey,)).fetchone()
            if current + amount < 0:
                raise ChainError(rules.BAD_INPUT, f"cannot remove {-amount:g}: hotkey holds {current:g}")
            conn.execute("INSERT INTO stake_log (hotkey, block, delta) VALUES (?, ?, ?)",
                         (hotkey, self.block(), float(amount)))
            return float(current + amount)

    def integrity_check(self) -> str:
        """SQLite's own structural check of the file ('ok' when sound)."""
        with self._lock:
            return self._conn.execute("PRAGMA integrity_check").fetchone()[0]
