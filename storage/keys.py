"""Object keys (design §3), all versioned by the protocol version ``v``.

Writers and readers build keys only through these functions, so a protocol
bump (new ``v``) never reads an old-format object.  :func:`parse` is the
inverse, used by cleanup to find the window a key belongs to.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


def _nat(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


def gradient(window: int, uid: int, version: int) -> str:
    return f"gradient/{_nat('window', window)}/{_nat('uid', uid)}-v{_nat('version', version)}.safetensors"


def commit(window: int, uid: int, version: int) -> str:
    """Commit-reveal: the hash a miner publishes before its update becomes readable."""
    return f"commit/{_nat('window', window)}/{_nat('uid', uid)}-v{_nat('version', version)}.json"


def reveal(window: int, uid: int, version: int) -> str:
    """Commit-reveal: the nonce that opens the commitment, uploaded with the payload after the put window."""
    return f"reveal/{_nat('window', window)}/{_nat('uid', uid)}-v{_nat('version', version)}.json"


def checkpoint(window: int, version: int) -> str:
    return f"checkpoint/{_nat('window', window)}-v{_nat('version', version)}.safetensors"


def latest_checkpoint(version: int) -> str:
    return f"checkpoint/latest-v{_nat('version', version)}.json"


def manifest(version: int) -> str:
    """The run's protocol settings, published by a validator so nodes can refuse a mismatch."""
    return f"run/manifest-v{_nat('version', version)}.json"


def peers(window: int, version: int) -> str:
    return f"peers/{_nat('window', window)}-v{_nat('version', version)}.json"


def aggregate(window: int, version: int) -> str:
    return f"aggregate/{_nat('window', window)}-v{_nat('version', version)}.safetensors"


def ledger(window: int, version: int) -> str:
    return f"ledger/{_nat('window', window)}-v{_nat('version', version)}.json"


@dataclass(frozen=True)
class ParsedKey:
    kind: str          # gradient | commit | reveal | checkpoint | peers | aggregate | ledger
    window: int
    version: int
    uid: int | None = None


_NUM = r"(0|[1-9][0-9]{0,17})"
_PATTERNS = [
    (kind, re.compile(pattern))
    for kind, pattern in (
        ("gradient", rf"gradient/{_NUM}/{_NUM}-v{_NUM}\.safetensors"),
        ("commit", rf"commit/{_NUM}/{_NUM}-v{_NUM}\.json"),
        ("reveal", rf"reveal/{_NUM}/{_NUM}-v{_NUM}\.json"),
        ("checkpoint", rf"checkpoint/{_NUM}-v{_NUM}\.safetensors"),
        ("peers", rf"peers/{_NUM}-v{_NUM}\.json"),
        ("aggregate", rf"aggregate/{_NUM}-v{_NUM}\.safetensors"),
        ("ledger", rf"ledger/{_NUM}-v{_NUM}\.json"),
    )
]


def parse(key: str) -> ParsedKey | None:
    """The window-bearing key's parts, or None for anything else (e.g. the latest pointer)."""
    for kind, pattern in _PATTERNS:
        m = pattern.fullmatch(key)
        if m:
            nums = [int(g) for g in m.groups()]
            if len(nums) == 3:
                return ParsedKey(kind, nums[0], nums[2], uid=nums[1])
            return ParsedKey(kind, nums[0], nums[1])
    return None
