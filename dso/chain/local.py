"""LocalChain: the embedded chain every process of a local network shares through one SQLite file.

Time: block b starts at ``genesis + b * block_time`` (so all processes agree
without talking).  State is a set of append-mostly logs stamped with the block
they were written in — registrations, stake changes, commitments, weights,
ledger — so "the state at block x" is a query, and the lazily computed
consensus of each tempo is the same whoever computes it and whenever.

Every write is signed by the wallet's hotkey and verified twice: on write
(a process cannot write as another) and on first read of the row (a row
inserted into the file directly, without the hotkey's key, is ignored;
:mod:`dso.chain.local_state`).  Writers serialise with
``BEGIN IMMEDIATE`` + a busy timeout in WAL mode; SQLite's journal makes each
write atomic, so a killed writer never leaves a half-written state.
Rules and their reasons are in docs/chain.md.
"""
from __future__ import annotations

import json
import math
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dso.chain import rules
from dso.chain.base import STATE_HISTORY_BLOCKS, Chain, ChainError, ChainUnavailable, Neuron, WeightRules
from dso.chain.local_burn import BurnMixin
from dso.chain.local_epochs import EpochsMixin
from dso.chain.local_ledger import LedgerMixin
from dso.chain.local_state import StateMixin
from dso.chain.local_store import LocalChainParams, check_block, connect, create_file, params_from
from dso.chain.wallets import WalletError, hotkey_address, is_valid_address, sign, verify

_DOMAIN = b"dso-localchain/v1:"  # signatures made for this chain never verify elsewhere
_KEEP_COMMITMENTS = 4            # history kept per hotkey (only the latest valid one is read)


class LocalChain(BurnMixin, EpochsMixin, StateMixin, LedgerMixin, Chain):
    """One subnet in a SQLite file.  Create with :meth:`create`, attach with :meth:`open`."""

    def __init__(self, path: Path, conn: sqlite3.Connection, params: LocalChainParams, chain_id: str,
                 clock: Callable[[], float]):
        self.path, self.params, self.chain_id = path, params, chain_id
        self._conn, self._clock = conn, clock
        self._lock = threading.RLock()
        self._init_state()

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def create(cls, path: str | Path, *, exist_ok: bool = False, clock: Callable[[], float] = time.time,
               **settings: Any) -> LocalChain:
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
    def open(cls, path: str | Path, *, clock: Callable[[], float] = time.time) -> LocalChain:
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

    def _signed(self, wallet: Any, op: str, block: int, **fields: Any) -> tuple[str, str]:
        """(hotkey, signature) for a write; refuses a wallet that cannot sign for its claimed hotkey."""
        try:
            hotkey = hotkey_address(wallet)
            message = self._message(op, hotkey, block, **fields)
            signature = sign(wallet, message)
        except WalletError as e:
            raise ChainError(rules.BAD_SIGNATURE, str(e)) from None
        if not is_valid_address(hotkey) or not verify(hotkey, message, signature):
            raise ChainError(rules.BAD_SIGNATURE,
                             f"signature does not match hotkey {hotkey}: no process can write as another")
        return hotkey, signature

    @staticmethod
    def _hotkey(wallet: Any) -> str:
        try:
            return hotkey_address(wallet)
        except WalletError as e:
            raise ChainError(rules.BAD_INPUT, str(e)) from None

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

    def _state_block(self, block: int | None) -> int:
        """The block a state read is as of: now, or a produced block within STATE_HISTORY_BLOCKS."""
        now = self.block()
        if block is None:
            return now
        block = check_block(block)
        if block > now:
            raise ChainError(rules.FUTURE_BLOCK, f"block {block} is not produced yet (now {now})")
        if block < now - STATE_HISTORY_BLOCKS:
            raise ChainError(rules.PRUNED, f"the state of block {block} is pruned (now {now}; the chain keeps "
                                           f"{STATE_HISTORY_BLOCKS} blocks)")
        return block

    def metagraph(self, block: int | None = None) -> list[Neuron]:
        self._ensure_epochs()
        with self._txn(immediate=False) as conn:
            now = self._state_block(block)
            occupants, stakes = self._occupants(conn, now), self._stakes(conn, now)
            permits = self._permits(occupants, stakes)
            incentive = self._incentive(conn)
            emission = dict(conn.execute("SELECT hotkey, amount FROM emission").fetchall())
            updated = {uid: self._last_update(conn, hotkey, registered, now)
                       for uid, (hotkey, registered) in occupants.items()}
        out = []
        for uid in sorted(occupants):
            hotkey = occupants[uid][0]
            inc_hotkey, inc = incentive.get(uid, (None, 0.0))
            out.append(Neuron(uid=uid, hotkey=hotkey, stake=stakes.get(hotkey, 0.0),
                              validator_permit=uid in permits, incentive=inc if inc_hotkey == hotkey else 0.0,
                              emission=emission.get(hotkey, 0.0), last_update=updated[uid]))
        return out

    def _last_update(self, conn: sqlite3.Connection, hotkey: str, registered: int, now: int) -> int:
        """Block of the hotkey's latest valid weight post since it registered (0 = none)."""
        latest = self._latest_weights(conn, hotkey, now, since=registered)
        return latest[0] if latest is not None else 0

    def weight_rules(self) -> WeightRules:
        p = self.params
        return WeightRules(rate_limit_blocks=p.weights_rate_limit, min_allowed_weights=p.min_allowed_weights,
                           max_weight_limit=p.max_weight_limit, version_key=p.weights_version)

    def register(self, wallet: Any) -> int:
        """The hotkey's uid; a new one burns the registration price from the hotkey's balance (local_burn.py).  On
        a full subnet the newcomer replaces the lowest-incentive neuron that is past its immunity and holds no
        validator permit; ``subnet_full`` when there is none, ``insufficient_balance`` when it cannot pay."""
        hotkey = self._hotkey(wallet)
        with self._txn(immediate=True) as conn:
            now = self.block()
            occupants = self._occupants(conn, now)
            uid: int | None
            for uid, (held_by, _) in occupants.items():
                if held_by == hotkey:
                    return uid
            uid = next((u for u in range(self.params.max_uids) if u not in occupants), None)
            if uid is None:
                uid = self._evictable(conn, occupants, now)
            _, signature = self._signed(wallet, "register", now, uid=uid)
            self._burn_for_registration(conn, hotkey, now)
            conn.execute("INSERT INTO registrations (uid, hotkey, block, signature) VALUES (?, ?, ?, ?)",
                         (uid, hotkey, now, signature))
            conn.execute("DELETE FROM emission WHERE hotkey = ?", (hotkey,))  # a new registration starts at 0
            return uid

    def _evictable(self, conn: sqlite3.Connection, occupants: dict[int, tuple[str, int]], now: int) -> int:
        """The uid a newcomer replaces on a full subnet (rules.pick_eviction), or ChainError ``subnet_full``."""
        incentive = self._incentive(conn)

        def last_incentive(u: int, hk: str) -> float:
            held_by, value = incentive.get(u, ("", 0.0))
            return value if held_by == hk else 0.0
        p = self.params
        permits = self._permits(occupants, self._stakes(conn, now))
        uid = rules.pick_eviction([(u, last_incentive(u, hk), reg) for u, (hk, reg) in occupants.items()],
                                  now, p.immunity_blocks, protected=permits, min_non_immune=p.min_non_immune_uids)
        if uid is None:
            immune = sorted(reg + p.immunity_blocks for u, (_, reg) in occupants.items()
                            if u not in permits and reg + p.immunity_blocks > now)
            needed = p.min_non_immune_uids + 1 - (len(occupants) - len(permits) - len(immune))
            when = f"; one becomes replaceable at block {immune[needed - 1]}" if 0 < needed <= len(immune) else ""
            raise ChainError(rules.SUBNET_FULL, f"all {p.max_uids} uids are taken by validator permit holders, "
                                                f"immune neurons and the last {p.min_non_immune_uids} past "
                                                f"immunity{when}")
        return uid

    def _require_uid(self, conn: sqlite3.Connection, hotkey: str, now: int) -> tuple[int, dict[int, tuple[str, int]]]:
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

    def commitments(self, block: int | None = None) -> dict[int, str]:
        with self._txn(immediate=False) as conn:
            now = self._state_block(block)
            out = {}
            for uid, (hotkey, _) in sorted(self._occupants(conn, now).items()):
                latest = self._latest_commitment(conn, hotkey, now)
                if latest is not None:
                    out[uid] = latest[1]
            return out

    def set_weights(self, wallet: Any, uids: list[int], weights: list[float],
                    version_key: int | None = None) -> None:
        """Checks in the real chain's order: registered, permit, version key, rate limit, enough positive
        weights; then stored as posted (signed) and read back normalised and clipped to max_weight_limit."""
        p = self.params
        normalised = rules.normalise_weights(uids, weights, n_uids=p.max_uids)
        version = self.weights_version if version_key is None else version_key
        if not rules.is_int(version) or version < 0:
            raise ChainError(rules.BAD_INPUT, f"version_key must be an integer >= 0, got {version!r}")
        hotkey = self._hotkey(wallet)
        with self._txn(immediate=True) as conn:
            now = self.block()
            uid, occupants = self._require_uid(conn, hotkey, now)
            stakes = self._stakes(conn, now)
            if uid not in self._permits(occupants, stakes):
                raise ChainError(rules.NO_PERMIT, f"uid {uid} has no validator permit: stake "
                                 f"{stakes.get(hotkey, 0.0):g}, needs >= {p.min_validator_stake:g} "
                                 f"and a top-{p.max_validators} stake")
            if version < p.weights_version:
                raise ChainError(rules.OUTDATED_VERSION, f"version key {version} is below the subnet's weights "
                                 f"version {p.weights_version}: upgrade, or set --subtensor.weights_version")
            last = self._last_update(conn, hotkey, occupants[uid][1], now)
            if last and now - last < p.weights_rate_limit:
                raise ChainError(rules.RATE_LIMITED, f"weights were set at block {last}; one post per "
                                 f"{p.weights_rate_limit} blocks, next allowed at block {last + p.weights_rate_limit}")
            needed = rules.required_weights(p.min_allowed_weights, len(occupants))
            positive = sum(1 for w in normalised.values() if w > 0)
            if positive < needed and not rules.is_self_weight(normalised, uid):
                raise ChainError(rules.TOO_FEW_WEIGHTS, f"{positive} positive weights; the subnet needs at least "
                                 f"{needed} (min_allowed_weights {p.min_allowed_weights}, {len(occupants)} uids)")
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
            result: str = self._conn.execute("PRAGMA integrity_check").fetchone()[0]
            return result
