"""The LocalChain file: its schema, its parameters, and how it is created and opened.

Creation is atomic (the file is built under a temporary name, then hard-linked
into place), so a process never opens a half-initialised chain and two
processes creating the same chain cannot both win.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from dso.chain import rules
from dso.chain.base import ChainError, ChainUnavailable
from dso.chain.local_burn import BURN_SCHEMA

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE params (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE registrations (id INTEGER PRIMARY KEY AUTOINCREMENT, uid INTEGER NOT NULL,
    hotkey TEXT NOT NULL, block INTEGER NOT NULL, signature TEXT NOT NULL);
CREATE TABLE stake_log (id INTEGER PRIMARY KEY AUTOINCREMENT, hotkey TEXT NOT NULL,
    block INTEGER NOT NULL, delta REAL NOT NULL);
CREATE TABLE commitments (id INTEGER PRIMARY KEY AUTOINCREMENT, hotkey TEXT NOT NULL,
    block INTEGER NOT NULL, data TEXT NOT NULL, signature TEXT NOT NULL);
CREATE INDEX commitments_by_hotkey ON commitments(hotkey, block);
CREATE TABLE weights (id INTEGER PRIMARY KEY AUTOINCREMENT, hotkey TEXT NOT NULL,
    block INTEGER NOT NULL, uids TEXT NOT NULL, weights TEXT NOT NULL, signature TEXT NOT NULL);
CREATE INDEX weights_by_hotkey ON weights(hotkey, block);
CREATE TABLE randomness (block INTEGER PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE consensus (id INTEGER PRIMARY KEY CHECK (id = 1), epoch INTEGER NOT NULL,
    incentive TEXT NOT NULL);
CREATE TABLE emission (hotkey TEXT PRIMARY KEY, amount REAL NOT NULL);
CREATE TABLE ledger (seq INTEGER PRIMARY KEY, block INTEGER NOT NULL, hotkey TEXT NOT NULL,
    prev_hash TEXT NOT NULL, hash TEXT NOT NULL, record TEXT NOT NULL, signature TEXT NOT NULL);
CREATE TRIGGER ledger_no_update BEFORE UPDATE ON ledger BEGIN SELECT RAISE(ABORT, 'ledger is append-only'); END;
CREATE TRIGGER ledger_no_delete BEFORE DELETE ON ledger BEGIN SELECT RAISE(ABORT, 'ledger is append-only'); END;
INSERT INTO consensus VALUES (1, 0, '{}');
"""


@dataclass(frozen=True)
class LocalChainParams:
    """Chain parameters, fixed at creation and stored in the file so every process agrees."""

    genesis: float = 0.0               # unix time of block 0
    block_time: float = 1.0            # seconds per block
    max_uids: int = 256
    tempo: int = 10                    # blocks between consensus runs
    # a new neuron cannot be evicted for this long: the real chain's default, and far more than a new
    # honest miner needs to earn incentive (~20 windows of 12 blocks + a tempo; docs/chain.md)
    immunity_blocks: int = 4096
    # neurons past immunity are replaced only while more than this many are (subtensor's MinNonImmuneUids)
    min_non_immune_uids: int = 10
    commit_max_bytes: int = rules.REAL_CHAIN_COMMIT_BYTES
    commit_interval_blocks: int = 10   # at most one (changed) commitment per hotkey per interval
    max_validators: int = 64           # permits go to the largest stakes ...
    min_validator_stake: float = 1.0   # ... of at least this much
    emission_per_block: float = 1.0    # accrued to uids by incentive, every tempo
    kappa: float = 0.5                 # consensus needs MORE than this share of stake
    ledger_max_bytes: int = 262_144    # canonical JSON size of one ledger record
    # --- the real chain's weight and stake rules (docs/chain.md: the real chain's values and why these defaults)
    weights_rate_limit: int = 0        # blocks between two weight posts of a hotkey (subtensor: 100)
    min_allowed_weights: int = 0       # positive weights a post needs, capped at the subnet size
    max_weight_limit: float = 1.0      # largest share one uid may get; rows are clipped to it
    weights_version: int = 0           # posts with a lower version key are refused
    emission_to_stake: float = 0.0     # share of each tempo's emission staked on the earner's hotkey (subtensor: 1)
    # --- registration burn (dso/chain/local_burn.py; subtensor's defaults: Burn 1 TAO, BurnHalfLife 360 blocks,
    # BurnIncreaseMult 1.26, MinBurn 0.0005, MaxBurn 100)
    burn_initial: float = 1.0          # what the first registration burns
    burn_half_life: int = 360          # the burn halves once per this many blocks ...
    burn_increase_mult: float = 1.26   # ... and is multiplied by this after each registration
    burn_min: float = 0.0005
    burn_max: float = 100.0

    def validate(self) -> LocalChainParams:
        for f in dataclasses.fields(self):
            value, wanted = getattr(self, f.name), type(f.default)
            if not (rules.is_int(value) if wanted is int else rules.is_real(value)) or \
                    (wanted is float and not math.isfinite(value)):
                kind = "an integer" if wanted is int else "a finite number"
                raise ChainError(rules.BAD_INPUT, f"{f.name} must be {kind}"
                                                  f", got {value!r}")
        for name in ("block_time", "max_uids", "tempo", "commit_max_bytes", "max_validators",
                     "ledger_max_bytes"):
            if not getattr(self, name) > 0:
                raise ChainError(rules.BAD_INPUT, f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("immunity_blocks", "min_non_immune_uids", "commit_interval_blocks", "min_validator_stake",
                     "emission_per_block"):
            if not getattr(self, name) >= 0:
                raise ChainError(rules.BAD_INPUT, f"{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("weights_rate_limit", "min_allowed_weights", "weights_version", "emission_to_stake",
                     "burn_initial", "burn_min"):
            if not getattr(self, name) >= 0:
                raise ChainError(rules.BAD_INPUT, f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not self.burn_half_life > 0 or not self.burn_increase_mult >= 1 or not self.burn_max >= self.burn_min:
            raise ChainError(rules.BAD_INPUT, "burn_half_life must be > 0, burn_increase_mult >= 1 and "
                                              f"burn_max >= burn_min (got {self.burn_half_life}, "
                                              f"{self.burn_increase_mult}, {self.burn_max} < {self.burn_min}?)")
        if not 0 < self.max_weight_limit <= 1:
            raise ChainError(rules.BAD_INPUT, f"max_weight_limit must be in (0, 1], got {self.max_weight_limit}")
        if not 0 < self.kappa < 1:
            raise ChainError(rules.BAD_INPUT, f"kappa must be in (0, 1), got {self.kappa}")
        return self


def check_block(block: Any) -> int:
    if not rules.is_int(block) or block < 0:
        raise ChainError(rules.BAD_INPUT, f"block must be an integer >= 0, got {block!r}")
    return int(block)


def create_file(path: Path, params: LocalChainParams) -> None:
    """Write a fresh chain file at ``path``; ChainError('exists') if one is there already."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        conn = sqlite3.connect(tmp)
        try:
            conn.executescript(SCHEMA + BURN_SCHEMA)
            conn.executemany("INSERT INTO params VALUES (?, ?)", [
                ("schema_version", str(SCHEMA_VERSION)), ("chain_id", secrets.token_hex(16)),
                ("params", json.dumps(dataclasses.asdict(params)))])
            conn.commit()
            conn.execute("PRAGMA journal_mode=WAL")  # persistent: every later connection uses WAL
        finally:
            conn.close()
        try:
            os.link(tmp, path)  # atomic, and never clobbers a chain created meanwhile
        except FileExistsError:
            raise ChainError("exists", f"a local chain already exists at {path}") from None
        except OSError:  # file systems without hard links
            if path.exists():
                raise ChainError("exists", f"a local chain already exists at {path}") from None
            os.replace(tmp, path)
    finally:
        for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
            leftover.unlink(missing_ok=True)


def params_from(settings: dict[str, Any]) -> LocalChainParams:
    known = {f.name for f in dataclasses.fields(LocalChainParams)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ChainError(rules.BAD_INPUT, f"unknown chain setting(s) {unknown}; known: {sorted(known)}")
    return LocalChainParams(**settings).validate()


def connect(path: Path) -> tuple[sqlite3.Connection, LocalChainParams, str]:
    """(connection, parameters, chain id) of an existing chain file; ChainUnavailable otherwise."""
    if not path.is_file():
        raise ChainUnavailable(
            f"no local chain at {path}: start the local network with `python scripts/localnet.py`")
    conn = None
    try:
        # mode=rw: never create an empty file; isolation_level=None: transactions are explicit
        conn = sqlite3.connect(f"file:{quote(str(path))}?mode=rw", uri=True, timeout=30.0,
                               isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout=30000")
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process crashes
        meta = dict(conn.execute("SELECT key, value FROM params").fetchall())
        if int(meta["schema_version"]) != SCHEMA_VERSION:
            raise ValueError(f"schema version {meta['schema_version']}, expected {SCHEMA_VERSION}")
        params = LocalChainParams(**json.loads(meta["params"])).validate()
        conn.executescript(BURN_SCHEMA)  # a file written before the burn existed gains its tables
        return conn, params, meta["chain_id"]
    except (sqlite3.Error, KeyError, ValueError, TypeError, ChainError) as e:
        if conn is not None:
            conn.close()
        raise ChainUnavailable(f"{path} is not a usable DSO local chain ({e})") from None
