"""Everything a validator must remember between windows, saved atomically as JSON.

The state holds every per-peer quantity (μ, rating, last scores, counters,
offences), the validator's private secret (all its per-window randomness is
derived from secret + window, so a restarted validator draws the same samples),
the evaluated/fast sets and top-G list of the last window, and the last weights.
Saving after every window and loading on start therefore makes a restart
invisible in the weights.

JSON keeps floats exact (Python writes the shortest repr that reads back to the
same double); non-finite values are written as the strings "inf", "-inf", "nan"
so the file stays standard JSON.  :func:`load` is strict: any unknown, missing,
mistyped or out-of-bounds field, a file of an earlier state version, or a damaged
file (any size, nesting or number) raises :class:`StateError` naming the file and
the field — never another exception.
"""
from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from dso.config.schema import HELP_MEMORY_MAX
from dso.util.atomic import atomic_write
from scoring.formulas import MU_MAX, MU_MIN, POC_BOUND
from scoring.history import UploadHistory
from scoring.rating import RATING_MU_BOUND, SIGMA_MAX, SIGMA_MIN, Rating, initial_rating, ordinal

T = TypeVar("T")

# 2: μ and ratings are bounded (docs/scoring.md, "Bounds").  Version 1 states may hold any μ down to −inf,
# so they are refused rather than silently clamped.  3: the proof of computation is a per-evaluation test with a
# record of verified work (``work``, ``poc_z``, ``poc_failed_window``); μ is the EMA of its verdicts.
STATE_VERSION = 3
OFFENCE_CATEGORIES = ("missing", "timing", "format", "sync", "commit", "invalid")  # invalid: see scoring.window
MAX_STATE_BYTES = 256 * 1024 * 1024  # ~1 KB per peer: far above any subnet
MAX_INT = 2 ** 53                    # windows, uids and counters: exact in a double, far above any run


class StateError(ValueError):
    """A state file that cannot be used; the message says which file and why."""


class ForeignRunError(StateError):
    """A valid state of another run (other settings): an operator's mistake, not damage."""


@dataclass
class PeerState:
    hotkey: str = ""                     # "" = not known; a different hotkey on the uid resets the peer
    mu: float = 0.0                      # proof-of-computation μ_p; fast-check penalties apply here
    rating_mu: float = field(default_factory=lambda: initial_rating()[0])
    rating_sigma: float = field(default_factory=lambda: initial_rating()[1])
    loss_score: float | None = None      # last δ_rand (LossScore)
    delta_assigned: float | None = None  # last δ_assigned
    sync_score: float | None = None      # last SyncScore
    eval_count: int = 0
    last_eval_window: int = -1
    last_fast_window: int = -1
    offences: dict[str, int] = field(default_factory=dict)  # category → count
    last_offence: str = ""               # str(Rejection) of the latest failure
    copies: int = 0                      # windows rejected as a copy (duplicate, near-copy, mix): the pay rule's record
    passes: int = 0                      # windows it took part in and passed every check
    help_ratios: list[float] = field(default_factory=list)  # the last evaluations' help ratios, oldest first,
    #                                   each in [−1, 1]: the pay gate's record (scoring/formulas.py)
    poc_record: list[float] = field(default_factory=list)  # the last evaluations' proof-of-computation statistics,
    #                                   oldest first, within ±POC_BOUND (scoring/formulas.py work_proven)
    work: list[int] = field(default_factory=list)  # the sequences it declared it trained on in those evaluations
    poc_failed_window: int = -1          # the last window it uploaded something that took no work (the cooldown)

    @property
    def rating(self) -> Rating:
        return (self.rating_mu, self.rating_sigma)

    @property
    def loss_rating(self) -> float:
        """The library's ordinal μ − 3σ; the weights use ``ordinal(rating, hp.rating_z)`` (scoring/window.py)."""
        return ordinal(self.rating)


@dataclass
class ValidatorState:
    secret: str                                   # 32 hex chars, never published
    window: int = -1                              # last window scored
    run_digest: str = ""                          # HParams.digest() of the run
    peers: dict[int, PeerState] = field(default_factory=dict)
    top_g: list[int] = field(default_factory=list)      # list in effect for window + 1
    evaluated: list[int] = field(default_factory=list)  # S_t of the last window
    fast: list[int] = field(default_factory=list)       # F_t of the last window
    weights: dict[int, float] = field(default_factory=dict)
    version: int = STATE_VERSION
    # sketches of recent updates (scoring/history.py): saved beside the state by neurons/validator_state.py, not in it
    history: UploadHistory = field(default_factory=UploadHistory, repr=False, compare=False)

    @classmethod
    def new(cls, run_digest: str = "", secret: str | None = None) -> ValidatorState:
        return cls(secret=secret or secrets.token_hex(16), run_digest=run_digest)

    def peer(self, uid: int) -> PeerState:
        if uid not in self.peers:
            self.peers[uid] = PeerState()
        return self.peers[uid]

    def standing(self) -> list[int]:
        """Known peers by last-window standing, best first: last weight, then μ, then uid.  The order a
        validator gathers them in (``gather(..., priority=state.standing())``): peers that were honest
        last window are fetched before unknown or failing ones, so impostors cannot delay them."""
        return sorted(self.peers, key=lambda uid: (-self.weights.get(uid, 0.0), -self.peers[uid].mu, uid))

    def rng(self, window: int, purpose: int) -> np.random.Generator:
        """The validator's private randomness for one purpose of one window (restart-proof)."""
        key = bytes.fromhex(self.secret)
        words = [int.from_bytes(key[i:i + 4], "little") for i in range(0, len(key), 4)]
        return np.random.default_rng([*words, window & 0xFFFFFFFF, window >> 32 & 0xFFFFFFFF, purpose])

    # ------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version, "secret": self.secret, "window": self.window, "run_digest": self.run_digest,
            "peers": {str(uid): _peer_to_dict(p) for uid, p in sorted(self.peers.items())},
            "top_g": list(self.top_g), "evaluated": list(self.evaluated), "fast": list(self.fast),
            "weights": {str(uid): _encode_float(w) for uid, w in sorted(self.weights.items())},
        }

    def save(self, path: str | Path) -> None:
        """Write atomically (see :func:`dso.util.atomic.atomic_write`)."""
        atomic_write(path, json.dumps(self.to_dict(), allow_nan=False, indent=1, sort_keys=True).encode())


def load(path: str | Path, run_digest: str = "") -> ValidatorState:
    """Read a saved state; raises :class:`StateError` for a missing, corrupt or foreign file."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_STATE_BYTES:
            raise StateError(f"validator state {path}: larger than {MAX_STATE_BYTES} bytes")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise StateError(f"validator state {path}: no such file") from None
    except OSError as e:
        raise StateError(f"validator state {path}: cannot read ({e.strerror})") from None
    try:
        data = json.loads(raw)
        state = from_dict(data)
    except RecursionError:
        raise StateError(f"validator state {path}: nested too deeply (damaged file)") from None
    except (ValueError, UnicodeDecodeError, OverflowError, TypeError) as e:
        raise StateError(f"validator state {path}: {str(e)[:300]}") from None
    if run_digest and state.run_digest and state.run_digest != run_digest:
        raise ForeignRunError(f"validator state {path}: saved for run {state.run_digest}, this run is "
                              f"{run_digest}; move the file away to start fresh")
    return state


def load_or_new(path: str | Path, run_digest: str = "") -> ValidatorState:
    """The saved state if the file exists (strictly checked), else a fresh one."""
    if not Path(path).exists():
        return ValidatorState.new(run_digest)
    return load(path, run_digest)


def from_dict(data: Any) -> ValidatorState:
    d = _fields(data, "state", {"version", "secret", "window", "run_digest", "peers", "top_g", "evaluated",
                                "fast", "weights"})
    if isinstance(d["version"], int) and not isinstance(d["version"], bool) and 0 < d["version"] < STATE_VERSION:
        raise ValueError(f"written by an earlier version (state version {d['version']}, this validator reads "
                         f"{STATE_VERSION}: the proof of computation and its record changed; move the state away to "
                         "start the scores afresh)")
    if d["version"] != STATE_VERSION:
        raise ValueError(f"state version {str(d['version'])[:20]!r} is not {STATE_VERSION}")
    secret = _typed(d["secret"], str, "secret")
    try:
        if len(bytes.fromhex(secret)) != 16:
            raise ValueError
    except ValueError:
        raise ValueError("secret: expected 32 hex characters") from None
    peers_raw = _typed(d["peers"], dict, "peers")
    return ValidatorState(
        secret=secret, window=_int(d["window"], "window"), run_digest=_typed(d["run_digest"], str, "run_digest"),
        peers={_uid(k, "peers"): _peer_from_dict(v, f"peers.{k}") for k, v in peers_raw.items()},
        top_g=_uid_list(d["top_g"], "top_g"), evaluated=_uid_list(d["evaluated"], "evaluated"),
        fast=_uid_list(d["fast"], "fast"),
        weights={_uid(k, "weights"): _weight(v, f"weights.{k}")
                 for k, v in _typed(d["weights"], dict, "weights").items()},
    )


def _weight(value: Any, where: str) -> float:
    w = _decode_float(value, where)
    if not 0.0 <= w <= 1.0:
        raise ValueError(f"{where}: a weight must be in [0, 1], got {w!r}")
    return w


# ---------------------------------------------------------------- helpers
_PEER_FLOATS = ("mu", "rating_mu", "rating_sigma")
_PEER_OPTIONAL = ("loss_score", "delta_assigned", "sync_score")
_PEER_INTS = ("eval_count", "last_eval_window", "last_fast_window", "poc_failed_window")
_PEER_COUNTS = ("copies", "passes")


def _peer_to_dict(p: PeerState) -> dict[str, Any]:
    out: dict[str, Any] = {f.name: getattr(p, f.name) for f in fields(p)}
    for name in _PEER_FLOATS + _PEER_OPTIONAL:
        out[name] = None if out[name] is None else _encode_float(out[name])
    out["help_ratios"] = [_encode_float(r) for r in p.help_ratios]
    out["work"] = list(p.work)
    out["poc_record"] = [_encode_float(z) for z in p.poc_record]
    out["offences"] = dict(sorted(p.offences.items()))
    return out


def _help_ratios(data: Any, where: str) -> list[float]:
    ratios = [_decode_float(r, f"{where}[{i}]") for i, r in enumerate(_typed(data, list, where))]
    if len(ratios) > HELP_MEMORY_MAX:
        raise ValueError(f"{where}: {len(ratios)} entries, at most {HELP_MEMORY_MAX}")
    for i, ratio in enumerate(ratios):
        if not -1.0 <= ratio <= 1.0:
            raise ValueError(f"{where}[{i}]: {ratio!r} outside [-1, 1]")
    return ratios


def _work(data: Any, where: str) -> list[int]:
    work = [_int(w, f"{where}[{i}]") for i, w in enumerate(_typed(data, list, where))]
    if len(work) > HELP_MEMORY_MAX:
        raise ValueError(f"{where}: {len(work)} entries, at most {HELP_MEMORY_MAX}")
    if any(w < 0 for w in work):
        raise ValueError(f"{where}: verified work must be >= 0")
    return work


def _poc_record(data: Any, where: str) -> list[float]:
    record = [_decode_float(z, f"{where}[{i}]") for i, z in enumerate(_typed(data, list, where))]
    if len(record) > HELP_MEMORY_MAX:
        raise ValueError(f"{where}: {len(record)} entries, at most {HELP_MEMORY_MAX}")
    if any(not -POC_BOUND <= z <= POC_BOUND for z in record):
        raise ValueError(f"{where}: a statistic outside [-{POC_BOUND:g}, {POC_BOUND:g}]")
    return record


def _peer_from_dict(data: Any, where: str) -> PeerState:
    d = _fields(data, where, {f.name for f in fields(PeerState)})
    peer = PeerState(hotkey=_typed(d["hotkey"], str, f"{where}.hotkey"),
                     last_offence=_typed(d["last_offence"], str, f"{where}.last_offence"))
    for name in _PEER_FLOATS:
        value = _decode_float(d[name], f"{where}.{name}")
        if not math.isfinite(value):
            raise ValueError(f"{where}.{name}: must be finite")
        setattr(peer, name, value)
    for name in _PEER_OPTIONAL:
        setattr(peer, name, None if d[name] is None else _decode_float(d[name], f"{where}.{name}"))
    for name in _PEER_INTS:
        setattr(peer, name, _int(d[name], f"{where}.{name}"))
    peer.help_ratios = _help_ratios(d["help_ratios"], f"{where}.help_ratios")
    peer.work = _work(d["work"], f"{where}.work")
    peer.poc_record = _poc_record(d["poc_record"], f"{where}.poc_record")
    for name in _PEER_COUNTS:
        if _int(d[name], f"{where}.{name}") < 0:
            raise ValueError(f"{where}.{name}: must be >= 0")
        setattr(peer, name, d[name])
    for name, low, high in (("mu", MU_MIN, MU_MAX), ("rating_mu", -RATING_MU_BOUND, RATING_MU_BOUND),
                            ("rating_sigma", SIGMA_MIN, SIGMA_MAX)):
        if not low <= getattr(peer, name) <= high:
            raise ValueError(f"{where}.{name}: {getattr(peer, name)!r} outside its bounds [{low:g}, {high:g}]")
    offences = _typed(d["offences"], dict, f"{where}.offences")
    for category, count in offences.items():
        if category not in OFFENCE_CATEGORIES:
            raise ValueError(f"{where}.offences: unknown category {category!r}")
        if _int(count, f"{where}.offences.{category}") < 0:
            raise ValueError(f"{where}.offences.{category}: must be >= 0")
    peer.offences = dict(offences)
    return peer


def _fields(data: Any, where: str, expected: set[str]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object")
    missing, extra = expected - set(data), set(data) - expected
    if missing or extra:
        raise ValueError(f"{where}: missing fields {sorted(missing)}, unknown fields {sorted(extra)}")
    return data


def _typed(value: Any, typ: type[T], where: str) -> T:
    if not isinstance(value, typ) or isinstance(value, bool):
        raise ValueError(f"{where}: expected {typ.__name__}, got {type(value).__name__}")
    return value


def _int(value: Any, where: str) -> int:
    number = _typed(value, int, where)
    if not -1 <= number <= MAX_INT:
        raise ValueError(f"{where}: {str(number)[:24]} is out of range")
    return number


def _uid(key: str, where: str) -> int:
    if not (isinstance(key, str) and key.isdigit() and len(key) <= 16 and int(key) <= MAX_INT):
        raise ValueError(f"{where}: key {str(key)[:24]!r} is not a uid")
    return int(key)


def _uid_list(value: Any, where: str) -> list[int]:
    items = _typed(value, list, where)
    if any(not isinstance(u, int) or isinstance(u, bool) or not 0 <= u <= MAX_INT for u in items):
        raise ValueError(f"{where}: expected a list of uids")
    return list(items)


_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _encode_float(x: float) -> float | str:
    x = float(x)
    if math.isfinite(x):
        return x
    return "nan" if x != x else ("inf" if x > 0 else "-inf")


def _decode_float(value: Any, where: str) -> float:
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise ValueError(f"{where}: {str(value)[:24]}… does not fit a double") from None
    raise ValueError(f"{where}: expected a number, got {str(value)[:40]!r}")
