"""Pure rules of the chain, shared by both backends: input checks, permits, consensus, ledger hashes.

Nothing here touches a database or the network, so every formula is tested
on its own.  Refusals raise :class:`ChainError` whose ``reason`` is one of the
short codes below (callers log it; tests assert it).
"""
from __future__ import annotations

import hashlib
import json
import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from dso.chain.base import ChainError

# ---------------------------------------------------------------- reasons
BAD_INPUT = "bad_input"            # wrong type / out-of-range argument
BAD_COMMITMENT = "bad_commitment"  # not a printable-ASCII string
TOO_LARGE = "too_large"            # commitment or ledger record above the size limit
RATE_LIMITED = "rate_limited"      # commitment sooner than the interval allows
NOT_REGISTERED = "not_registered"  # hotkey has no uid
NO_PERMIT = "no_permit"            # weights from a hotkey without a validator permit
BAD_WEIGHTS = "bad_weights"        # NaN / negative / mismatched / unknown uids
BAD_SIGNATURE = "bad_signature"    # signature does not match the claimed hotkey
SUBNET_FULL = "subnet_full"        # every uid is taken and still immune
FUTURE_BLOCK = "future_block"      # randomness (or state) of a block not produced yet
PRUNED = "pruned"                  # state of a block older than the chain keeps
BAD_RECORD = "bad_record"          # ledger record not a JSON object
UNSUPPORTED = "unsupported"        # the backend has no such feature
OUTDATED_VERSION = "outdated_version"  # weights posted with a version key below the subnet's
TOO_FEW_WEIGHTS = "too_few_weights"    # fewer positive weights than min_allowed_weights
INSUFFICIENT_BALANCE = "insufficient_balance"  # the registrant cannot pay the registration burn

# Subtensor's Commitments pallet holds at most 3 ``Raw`` fields of at most 128 bytes each.
RAW_FIELD_BYTES = 128
MAX_COMMIT_FIELDS = 3
REAL_CHAIN_COMMIT_BYTES = RAW_FIELD_BYTES * MAX_COMMIT_FIELDS

GENESIS_HASH = "0" * 64  # prev_hash of the first ledger record


# ------------------------------------------------------------ commitments
def check_commitment(data: Any, max_bytes: int) -> str:
    """Return ``data`` if it is a publishable commitment, else raise ChainError.

    A commitment is a non-empty string of printable ASCII (0x20-0x7e): what a
    bucket address and key pair need, and nothing that could smuggle control
    characters or ambiguous encodings into other peers' parsers.
    """
    if not isinstance(data, str):
        raise ChainError(BAD_COMMITMENT, f"commitment must be a string, got {type(data).__name__}")
    if not data:
        raise ChainError(BAD_COMMITMENT, "commitment is empty")
    bad = next((c for c in data if not " " <= c <= "~"), None)
    if bad is not None:
        raise ChainError(BAD_COMMITMENT,
                         f"commitment must be printable ASCII; found {bad!r} at {data.index(bad)}")
    if len(data) > max_bytes:
        raise ChainError(TOO_LARGE, f"commitment is {len(data)} bytes; the limit is {max_bytes}")
    return data


def commitment_fields(data: str) -> list[dict[str, bytes]]:
    """Split a checked commitment into Subtensor ``Raw<n>`` fields (<= 128 bytes each, <= 3)."""
    raw = check_commitment(data, REAL_CHAIN_COMMIT_BYTES).encode("ascii")
    return [{f"Raw{len(part)}": part}
            for part in (raw[i:i + RAW_FIELD_BYTES] for i in range(0, len(raw), RAW_FIELD_BYTES))]


# ---------------------------------------------------------------- weights
def is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def normalise_weights(uids: Any, weights: Any, *, n_uids: int | None = None) -> dict[int, float]:
    """Check a validator's weight vector and scale it to sum 1: {uid: weight}.

    Accepts lists/tuples/numpy arrays.  Refuses (``bad_weights``) mismatched
    lengths, an empty vector, duplicate or out-of-range uids, non-numbers,
    NaN/inf, negative values and an all-zero vector.
    """
    try:
        uids, weights = list(uids), list(weights)
    except TypeError:
        raise ChainError(BAD_WEIGHTS, "uids and weights must be sequences") from None
    if len(uids) != len(weights):
        raise ChainError(BAD_WEIGHTS, f"uids and weights differ in length ({len(uids)} vs {len(weights)})")
    if not uids:
        raise ChainError(BAD_WEIGHTS, "no weights given")
    seen: set[int] = set()
    for uid, w in zip(uids, weights, strict=True):
        if not is_int(uid):
            raise ChainError(BAD_WEIGHTS, f"uid {uid!r} is not an integer")
        if uid < 0 or (n_uids is not None and uid >= n_uids):
            raise ChainError(BAD_WEIGHTS, f"uid {uid} is out of range")
        if uid in seen:
            raise ChainError(BAD_WEIGHTS, f"uid {uid} appears twice")
        seen.add(int(uid))
        if not is_real(w):
            raise ChainError(BAD_WEIGHTS, f"weight for uid {uid} is not a number: {w!r}")
        if not math.isfinite(w):
            raise ChainError(BAD_WEIGHTS, f"weight for uid {uid} is not finite: {w}")
        if w < 0:
            raise ChainError(BAD_WEIGHTS, f"weight for uid {uid} is negative: {w}")
    top = max(float(w) for w in weights)
    if top <= 0:
        raise ChainError(BAD_WEIGHTS, "all weights are zero")
    scaled = [float(w) / top for w in weights]  # scale by the max first: the sum cannot overflow
    total = math.fsum(scaled)
    return {int(u): w / total for u, w in zip(uids, scaled, strict=True)}


def clip_max_weight(weights: dict[int, float], limit: float) -> dict[int, float]:
    """Normalised weights with no share above ``limit``, mass moved to the others (water-filling).

    Everything above a cutoff t is cut to t, the rest kept, and the row rescaled
    so that the cut entries land exactly on ``limit``: t = limit * R_k / (1 - k * limit)
    for the k largest cut and R_k the sum of the others.  A limit no row of this
    many positive entries can meet (n * limit <= 1) gives them equal shares.
    """
    total = math.fsum(weights.values())
    if total <= 0:
        raise ChainError(BAD_WEIGHTS, "all weights are zero")
    share = {u: w / total for u, w in weights.items()}
    positive = sorted((w for w in share.values() if w > 0), reverse=True)
    if not positive or positive[0] <= limit:
        return share
    if len(positive) * limit <= 1:
        return {u: (1.0 / len(positive) if w > 0 else 0.0) for u, w in share.items()}
    cutoff = positive[0]
    for k in range(1, len(positive) + 1):  # k = how many of the largest are cut
        rest = math.fsum(positive[k:])  # summed afresh: subtracting from the total cancels catastrophically
        cutoff = limit * rest / (1 - k * limit)
        if k == len(positive) or positive[k] <= cutoff:
            break
    clipped = {u: min(w, cutoff) for u, w in share.items()}
    scale = math.fsum(clipped.values())
    return {u: w / scale for u, w in clipped.items()}


def required_weights(min_allowed_weights: int, registered: int) -> int:
    """How many positive weights a post needs: the subnet minimum, capped at the number of uids."""
    return max(0, min(min_allowed_weights, registered))


def is_self_weight(weights: dict[int, float], own_uid: int | None) -> bool:
    """A lone weight on the poster's own uid: exempt from the minimum and the clip, as on the real chain."""
    return own_uid is not None and [u for u, w in weights.items() if w > 0] == [own_uid]


# ---------------------------------------------------------------- permits
def validator_permits(stakes: dict[int, float], max_validators: int, min_stake: float) -> set[int]:
    """uids holding a validator permit: the ``max_validators`` largest stakes (ties: lower uid)
    among those with at least ``min_stake`` (and more than zero)."""
    eligible = [(s, uid) for uid, s in stakes.items() if s >= min_stake and s > 0]
    eligible.sort(key=lambda t: (-t[0], t[1]))
    return {uid for _, uid in eligible[:max_validators]}


def pick_eviction(neurons: Iterable[tuple[int, float, int]], block: int, immunity_blocks: int,
                  protected: Iterable[int] = (), min_non_immune: int = 0) -> int | None:
    """uid replaced when a full subnet gets a new registration, or None when nobody may be.

    ``neurons`` holds (uid, incentive at the last consensus, registration block).  A neuron is immune for
    ``immunity_blocks`` after registering, and ``protected`` uids (validator permit holders) are never
    replaced.  The others are candidates only while more than ``min_non_immune`` of them exist (subtensor's
    ``MinNonImmuneUids``: the last few established neurons are not picked off one by one); among them the
    lowest incentive goes, ties broken by older registration, then lower uid.
    """
    keep = set(protected)
    candidates = [(inc, reg, uid) for uid, inc, reg in neurons if reg + immunity_blocks <= block and uid not in keep]
    return min(candidates)[2] if len(candidates) > min_non_immune else None


# -------------------------------------------------------------- consensus
def stake_weighted_median(values: Sequence[float], stakes: Sequence[float], kappa: float = 0.5) -> float:
    """The largest value v such that validators holding MORE than ``kappa`` of the stake
    put at least v on it (0 if none).  With equal stakes and an odd count this is the median."""
    total = float(sum(stakes))
    if total <= 0:
        return 0.0
    support = 0.0
    for v, s in sorted(zip(values, stakes, strict=True), key=lambda t: -t[0]):
        support += s
        if support - kappa * total > 1e-12 * total:
            return float(v)
    return 0.0


def yuma_consensus(W: Any, stakes: Any, kappa: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Simplified Yuma: (consensus per uid, incentive per uid).

    ``W`` is validators x uids (rows sum to 1 or 0), ``stakes`` per validator.
    consensus_j = stake-weighted median of column j; every weight above it is
    clipped to it; rank_j = sum_v stake_v * clipped_vj; incentive = rank / sum(rank).
    """
    W = np.asarray(W, dtype=np.float64)
    s = np.asarray(stakes, dtype=np.float64)
    n = W.shape[1] if W.ndim == 2 else 0
    if W.ndim != 2 or W.shape[0] == 0 or n == 0 or s.sum() <= 0:
        return np.zeros(n), np.zeros(n)
    s = s / s.sum()
    consensus = np.array([stake_weighted_median(W[:, j], s, kappa) for j in range(n)])
    rank = s @ np.minimum(W, consensus[None, :])
    total = rank.sum()
    return consensus, (rank / total if total > 0 else np.zeros(n))


# ----------------------------------------------------------------- ledger
def canonical_json(obj: Any) -> bytes:
    """One byte string per JSON value: sorted keys, no spaces, ASCII, no NaN (ValueError/TypeError)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def ledger_hash(prev_hash: str, record: dict[str, Any]) -> str:
    """hash = sha256(prev_hash || canonical JSON of the record), hex."""
    return hashlib.sha256(prev_hash.encode("ascii") + canonical_json(record)).hexdigest()
