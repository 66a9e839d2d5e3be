"""Object keys (design §3), versioned by the protocol version ``v`` and scoped by the network run.

Writers and readers build keys only through these functions, so a protocol
bump (new ``v``) never reads an old-format object, and a node never reads an
object another run left in a reused bucket: every object of a run lives under
``{run}/`` (the run id the leading validator publishes in its manifest, see
docs/protocol.md).  ``run=""`` builds the unscoped key, for tools and tests
that do not belong to a run.  The manifest itself is the one unscoped object: it
is how a node learns the run.  :func:`parse` is the inverse, used by cleanup.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypeGuard

RUN_ID_CHARS = 16  # hex digits of a run id


def _nat(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


def is_run_id(run: object) -> TypeGuard[str]:
    return isinstance(run, str) and len(run) == RUN_ID_CHARS and all(c in "0123456789abcdef" for c in run)


def _scoped(run: str, key: str) -> str:
    if run == "":
        return key
    if not is_run_id(run):
        raise ValueError(f"run must be {RUN_ID_CHARS} lowercase hex digits or empty, got {run!r}")
    return f"{run}/{key}"


def gradient(window: int, uid: int, version: int, run: str = "") -> str:
    return _scoped(run, f"gradient/{_nat('window', window)}/{_nat('uid', uid)}-v{_nat('version', version)}"
                        ".safetensors")


def signature(window: int, uid: int, version: int, run: str = "") -> str:
    """The miner's signature of its payload of ``window`` (storage/signature.py), published before the payload."""
    return _scoped(run, f"signature/{_nat('window', window)}/{_nat('uid', uid)}-v{_nat('version', version)}.json")


def commit(window: int, uid: int, version: int, run: str = "") -> str:
    """Commit-reveal: the hash a miner publishes before its update becomes readable."""
    return _scoped(run, f"commit/{_nat('window', window)}/{_nat('uid', uid)}-v{_nat('version', version)}.json")


def reveal(window: int, uid: int, version: int, run: str = "") -> str:
    """Commit-reveal: the nonce that opens the commitment, uploaded with the payload after the put window."""
    return _scoped(run, f"reveal/{_nat('window', window)}/{_nat('uid', uid)}-v{_nat('version', version)}.json")


def checkpoint(window: int, version: int, run: str = "") -> str:
    """The manifest of window's sharded checkpoint (storage/checkpoint_manifest.py)."""
    return _scoped(run, f"checkpoint/{_nat('window', window)}-v{_nat('version', version)}.json")


def checkpoint_shard(window: int, index: int, version: int, run: str = "") -> str:
    """Shard ``index`` of window's checkpoint (a safetensors object)."""
    return _scoped(run, f"checkpoint/{_nat('window', window)}/{_nat('index', index)}-v{_nat('version', version)}"
                        ".safetensors")


def latest_checkpoint(version: int, run: str = "") -> str:
    return _scoped(run, f"checkpoint/latest-v{_nat('version', version)}.json")


def manifest(version: int) -> str:
    """The run's protocol settings and run id, published by the leading validator (unscoped: it names the run)."""
    return f"run/manifest-v{_nat('version', version)}.json"


def peers(window: int, version: int, run: str = "") -> str:
    return _scoped(run, f"peers/{_nat('window', window)}-v{_nat('version', version)}.json")


def aggregate(window: int, version: int, run: str = "") -> str:
    return _scoped(run, f"aggregate/{_nat('window', window)}-v{_nat('version', version)}.safetensors")


def ledger(window: int, version: int, run: str = "") -> str:
    return _scoped(run, f"ledger/{_nat('window', window)}-v{_nat('version', version)}.json")


@dataclass(frozen=True)
class ParsedKey:
    # gradient | signature | commit | reveal | checkpoint | checkpoint_shard | peers | aggregate | ledger
    kind: str
    window: int
    version: int
    uid: int | None = None  # the uid of a gradient, commit or reveal; the index of a checkpoint shard
    run: str = ""      # "" = unscoped


_NUM = r"(0|[1-9][0-9]{0,17})"
_RUN = re.compile(rf"([0-9a-f]{{{RUN_ID_CHARS}}})/(.*)", re.DOTALL)
_PATTERNS = [
    (kind, re.compile(pattern))
    for kind, pattern in (
        ("gradient", rf"gradient/{_NUM}/{_NUM}-v{_NUM}\.safetensors"),
        ("signature", rf"signature/{_NUM}/{_NUM}-v{_NUM}\.json"),
        ("commit", rf"commit/{_NUM}/{_NUM}-v{_NUM}\.json"),
        ("reveal", rf"reveal/{_NUM}/{_NUM}-v{_NUM}\.json"),
        ("checkpoint", rf"checkpoint/{_NUM}-v{_NUM}\.json"),
        ("checkpoint_shard", rf"checkpoint/{_NUM}/{_NUM}-v{_NUM}\.safetensors"),
        ("peers", rf"peers/{_NUM}-v{_NUM}\.json"),
        ("aggregate", rf"aggregate/{_NUM}-v{_NUM}\.safetensors"),
        ("ledger", rf"ledger/{_NUM}-v{_NUM}\.json"),
    )
]


def parse(key: str) -> ParsedKey | None:
    """The window-bearing key's parts, or None for anything else (e.g. the latest pointer)."""
    run = ""
    scoped = _RUN.fullmatch(key)
    if scoped:
        run, key = scoped.groups()
    for kind, pattern in _PATTERNS:
        m = pattern.fullmatch(key)
        if m:
            nums = [int(g) for g in m.groups()]
            if len(nums) == 3:
                return ParsedKey(kind, nums[0], nums[2], uid=nums[1], run=run)
            return ParsedKey(kind, nums[0], nums[1], run=run)
    return None
