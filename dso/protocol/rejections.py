"""Why a peer's input was refused: one vocabulary shared by storage, scoring and the neurons.

Every check that refuses something another party sent returns a
:class:`Rejection` (never raises past its caller).  ``category`` groups reasons
into the Gauntlet fast-check classes: missing, timing, format — plus sync and
commit (commit-reveal offences).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Reason(str, Enum):
    MISSING = "missing"                  # nothing uploaded / not found
    UNREACHABLE = "unreachable"          # bucket unreadable: bad credentials, access denied, network error
    TIMEOUT = "timeout"                  # download did not finish before the per-peer deadline
    TOO_EARLY = "too_early"              # LastModified before the put window opened
    TOO_LATE = "too_late"                # absent at the validator's look after the close, or LastModified after it
    CHANGED = "changed"                  # the object read differs from the one the look saw at the close
    TOO_LARGE = "too_large"              # HEAD size above the cap
    MALFORMED = "malformed"              # not a safetensors file / bad header / bad JSON
    BAD_KEYS = "bad_keys"                # missing or extra tensors
    BAD_DTYPE = "bad_dtype"
    BAD_SHAPE = "bad_shape"
    INDEX_OUT_OF_RANGE = "index_out_of_range"
    WRONG_COUNT = "wrong_count"          # not exactly k indices in a chunk
    BAD_ENCODING = "bad_encoding"        # other non-canonical packing (order, padding, scale)
    NON_FINITE = "non_finite"
    METADATA_MISMATCH = "metadata_mismatch"  # uid, window, protocol version, codec or run settings differ
    BAD_COMMITMENT = "bad_commitment"    # chain commitment string unparsable
    UNSIGNED = "unsigned"                # no signature object next to the payload (dso/protocol/signatures.py)
    BAD_SIGNATURE = "bad_signature"      # not the uid's hotkey's signature of these bytes for this run and window
    OUT_OF_SYNC = "out_of_sync"          # SyncScore above threshold
    NO_COMMIT = "no_commit"              # commit-reveal: reveal without a timely commitment
    NO_REVEAL = "no_reveal"              # commit-reveal: commitment never revealed
    REVEAL_MISMATCH = "reveal_mismatch"  # commit-reveal: payload does not match the commitment
    DUPLICATE = "duplicate"              # identical to another peer's update
    REPLAY = "replay"                    # an update of an earlier window (its own, another peer's, an aggregate) again
    EMPTY = "empty"                      # an update that holds no value: no work
    DP_BUDGET = "dp_budget"              # (miner side) privacy budget spent


CATEGORY = {
    Reason.MISSING: "missing", Reason.UNREACHABLE: "missing", Reason.TIMEOUT: "missing",
    Reason.TOO_EARLY: "timing", Reason.TOO_LATE: "timing", Reason.CHANGED: "timing",
    Reason.OUT_OF_SYNC: "sync",
    Reason.NO_COMMIT: "commit", Reason.NO_REVEAL: "commit", Reason.REVEAL_MISMATCH: "commit",
    Reason.DUPLICATE: "commit", Reason.REPLAY: "commit", Reason.EMPTY: "commit", Reason.DP_BUDGET: "missing",
}


@dataclass(frozen=True)
class Rejection:
    reason: Reason
    detail: str = ""

    @property
    def category(self) -> str:
        return CATEGORY.get(self.reason, "format")

    def __str__(self) -> str:
        return f"{self.reason.value}: {self.detail}" if self.detail else self.reason.value


UNEXPECTED_DETAIL_CHARS = 160  # of the exception's message: enough to debug, too little to flood a log


def unexpected(reason: Reason, e: BaseException) -> Rejection:
    """The rejection for an exception a check did not foresee, from the handler that is its caller's last
    line of defence (a bug or a hostile input must not stop a validator):
    ``unexpected <exception type>: <message, cut>``."""
    return Rejection(reason, f"unexpected {type(e).__name__}: {str(e)[:UNEXPECTED_DETAIL_CHARS]}")
