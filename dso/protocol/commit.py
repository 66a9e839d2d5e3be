"""Commit-reveal of updates (ZIP-400 §4, ZIP-407 §3) and the penalties for its offences.

Inside the put window of window t a miner uploads only ``commitment_hash(t, uid, payload, nonce)``;
in the next window's put window it uploads the payload and the nonce.  A validator accepts the
payload only if it matches a commitment that was uploaded in time, so a copier cannot copy what
it could not read before commitments closed.

The hash input is unambiguous: every integer has a fixed width (big-endian) and every byte
string is preceded by its 8-byte length, so no two different (domain, window, uid, payload,
nonce) tuples share a preimage.  Timing (was the commitment inside its put window?) is checked
by the caller from S3 ``LastModified``; :func:`judge_reveal` turns the facts into a Rejection.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from dso.protocol.rejections import Reason, Rejection

DOMAIN = b"dso/commit/v1"
NONCE_BYTES = 32
_U64 = 1 << 64


def _u64(value: int, what: str) -> bytes:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _U64:
        raise ValueError(f"{what} must be an integer in [0, 2^64), got {value!r}")
    return value.to_bytes(8, "big")


def _field(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + bytes(data)


def commitment_hash(window: int, uid: int, payload: bytes, nonce: bytes, domain: bytes = DOMAIN) -> str:
    """sha3_256(len‖domain ‖ window ‖ uid ‖ len‖payload ‖ len‖nonce) as 64 lowercase hex digits."""
    h = hashlib.sha3_256()
    h.update(_field(domain))
    h.update(_u64(window, "window"))
    h.update(_u64(uid, "uid"))
    h.update(_field(payload))
    h.update(_field(nonce))
    return h.hexdigest()


def new_nonce() -> bytes:
    """32 bytes from the OS CSPRNG: nobody can test guesses of the payload against the commitment."""
    return secrets.token_bytes(NONCE_BYTES)


def is_commitment(text: object) -> bool:
    """Exactly 64 lowercase hex digits (what :func:`commitment_hash` returns)."""
    return isinstance(text, str) and len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def verify_reveal(commitment: str, window: int, uid: int, payload: bytes, nonce: bytes,
                  domain: bytes = DOMAIN) -> bool:
    """True only if ``commitment`` is well formed, the nonce has the protocol length and the hash
    of the revealed (window, uid, payload, nonce) equals it (constant-time comparison)."""
    if not is_commitment(commitment) or not isinstance(nonce, (bytes, bytearray)) or len(nonce) != NONCE_BYTES:
        return False
    if not isinstance(payload, (bytes, bytearray)):
        return False
    try:
        expected = commitment_hash(window, uid, bytes(payload), bytes(nonce), domain)
    except ValueError:
        return False
    return hmac.compare_digest(expected, commitment)


def judge_reveal(commitment: str | None, committed_in_time: bool, payload: bytes | None, nonce: bytes | None,
                 window: int, uid: int, domain: bytes = DOMAIN) -> Rejection | None:
    """The validator's verdict on one peer for one window; None = accept the payload.

    * a payload without a commitment uploaded inside its put window → NO_COMMIT
    * a timely commitment never revealed → NO_REVEAL
    * a reveal that does not hash to the commitment → REVEAL_MISMATCH"""
    has_commit = commitment is not None and committed_in_time
    if payload is None or nonce is None:
        if has_commit:
            return Rejection(Reason.NO_REVEAL, f"window {window}: committed but never revealed")
        return Rejection(Reason.MISSING, f"window {window}: neither commitment nor reveal")
    if commitment is None:
        return Rejection(Reason.NO_COMMIT, f"window {window}: reveal without any commitment")
    if not committed_in_time:
        return Rejection(Reason.NO_COMMIT, f"window {window}: commitment was not inside its put window")
    if not is_commitment(commitment):
        return Rejection(Reason.BAD_COMMITMENT, f"window {window}: commitment is not 64 hex digits")
    if not verify_reveal(commitment, window, uid, payload, nonce, domain):
        return Rejection(Reason.REVEAL_MISMATCH, f"window {window}: revealed payload/nonce do not match the commitment")
    return None


# ----------------------------------------------------------- duplicates
def content_digest(tensors: Mapping[str, np.ndarray]) -> str:
    """sha256 over (name, dtype, shape, bytes) of the tensors in name order: equal iff the update content
    is identical, whatever metadata (uid, window) the container carries."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        for part in (name.encode(), arr.dtype.str.encode(), repr(arr.shape).encode(), arr.tobytes()):
            h.update(len(part).to_bytes(8, "big") + part)
    return h.hexdigest()


def find_duplicates(digests: Mapping[int, str], commit_times: Mapping[int, float] | None = None
                    ) -> dict[int, Rejection]:
    """uids whose update content equals another's.  In each group of identical digests the peer with
    the earliest commitment (ties and missing times: lowest uid) keeps its update; the others are
    rejected as DUPLICATE."""
    commit_times = commit_times or {}
    groups: dict[str, list[int]] = {}
    for uid, digest in digests.items():
        groups.setdefault(digest, []).append(uid)
    out: dict[int, Rejection] = {}
    for uids in groups.values():
        if len(uids) < 2:
            continue
        order = sorted(uids, key=lambda u: (commit_times.get(u, float("inf")), u))
        for uid in order[1:]:
            out[uid] = Rejection(Reason.DUPLICATE, f"update identical to uid {order[0]}'s")
    return out


# ------------------------------------------------------------ penalties
@dataclass(frozen=True)
class Penalty:
    """What an offence costs: μ ← multiplier·μ (never raising μ), and exclusion from aggregation."""

    multiplier: float
    suspend_windows: int = 0  # excluded from top-G for this many windows
    banned: bool = False      # excluded until the uid is re-registered by another hotkey


# ZIP-407 §6 slash fractions, mapped onto the Gauntlet μ: the fast-check penalty φ first (any
# offence is at least as bad as a missed upload), then × (1 − slash).  Days become windows.
# "Invalid update" covers a reveal that does not match its commitment and every format failure.
NO_REVEAL_SLASH, INVALID_SLASH, COPY_SLASH = 0.05, 0.20, 0.50
INVALID_SUSPEND_WINDOWS, COPY_SUSPEND_WINDOWS = 7, 30
BAN_AFTER = 3  # ZIP-407: repeated invalid submissions (3+) → 100 % and a permanent ban


def is_invalid_update(reason: Reason | str) -> bool:
    """Offences that count toward the ban: a mismatching reveal, a copied update, a malformed payload."""
    reason = Reason(reason)
    return reason in (Reason.REVEAL_MISMATCH, Reason.DUPLICATE) or Rejection(reason).category == "format"


def penalty_for(offence: Reason | str, prior_offences: int = 0, fast_penalty: float = 0.75) -> Penalty:
    """The penalty for one offence, given how many invalid updates (:func:`count_invalid`) the uid
    made before.  Reasons outside the table (timing, sync, missing) get the plain fast-check φ."""
    offence = Reason(offence)
    if prior_offences < 0 or not 0 <= fast_penalty <= 1:
        raise ValueError("prior_offences must be >= 0 and fast_penalty in [0, 1]")
    if is_invalid_update(offence) and prior_offences + 1 >= BAN_AFTER:
        return Penalty(0.0, 0, True)
    if offence == Reason.DUPLICATE:
        return Penalty(fast_penalty * (1 - COPY_SLASH), COPY_SUSPEND_WINDOWS)
    if is_invalid_update(offence):
        return Penalty(fast_penalty * (1 - INVALID_SLASH), INVALID_SUSPEND_WINDOWS)
    if offence == Reason.NO_REVEAL:
        return Penalty(fast_penalty * (1 - NO_REVEAL_SLASH))
    return Penalty(fast_penalty)  # NO_COMMIT forfeits the window like a missed upload; others: Gauntlet φ


def commit_penalty(offence: Reason | str, prior_offences: int = 0, fast_penalty: float = 0.75) -> float:
    """The μ multiplier of :func:`penalty_for`."""
    return penalty_for(offence, prior_offences, fast_penalty).multiplier


def apply_penalty(mu: float, multiplier: float) -> float:
    """Sign-safe μ update: scaling a negative μ toward 0 would be a reward, so a penalty never raises μ."""
    return min(mu, multiplier * mu)


def count_invalid(history: Iterable[Reason | str]) -> int:
    """How many past offences of a uid count toward the ban (:func:`is_invalid_update`)."""
    return sum(1 for r in history if is_invalid_update(r))
