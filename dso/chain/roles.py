"""How a node says on chain that it runs this protocol as a validator: a role tag in its commitment.

A commitment is ``dso1|endpoint|region|bucket|key id|secret`` (storage/commitment.py);
a protocol validator appends one field, ``|validator``.  Miners publish the
six-field form, so every commitment written before roles existed still reads
as a miner's.  Stake and permits alone cannot tell a protocol validator: on
the real chain a successful miner earns stake and a permit, and a third-party
validator may hold a permit without running this protocol; the leader is
chosen among those that carry the tag (:func:`pick_leader`).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dso.chain.base import Neuron

SEPARATOR = "|"
VALIDATOR = "validator"
ROLES = (VALIDATOR,)
_BASE_FIELDS = 6  # dso1 + five storage fields


def with_role(commitment: str, role: str) -> str:
    """The commitment with ``role`` appended (replacing a role it had); ValueError for an unknown role."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; known: {', '.join(ROLES)}")
    fields = commitment.split(SEPARATOR)
    if len(fields) == _BASE_FIELDS + 1 and fields[-1] in ROLES:
        fields = fields[:-1]
    if len(fields) != _BASE_FIELDS:
        raise ValueError(f"a commitment has {_BASE_FIELDS} fields before its role, got {len(fields)}")
    return SEPARATOR.join(fields + [role])


def split_role(commitment: str) -> tuple[str, str | None]:
    """(commitment without its role, role or None).  A seventh field that is not a known role is left in
    place, so the strict parser rejects the string."""
    fields = commitment.split(SEPARATOR)
    if len(fields) == _BASE_FIELDS + 1 and fields[-1] in ROLES:
        return SEPARATOR.join(fields[:-1]), fields[-1]
    return commitment, None


def role_of(commitment: object) -> str | None:
    return split_role(commitment)[1] if isinstance(commitment, str) else None


def pick_leader(validators: Iterable[Neuron], now: int | None = None,
                max_idle_blocks: int | None = None) -> Neuron | None:
    """The leading protocol validator: the largest stake (ties: lower uid) among ``validators``
    (Neurons carrying the validator tag and a permit), skipping any whose last weight post is more than
    ``max_idle_blocks`` old when both ``now`` and ``max_idle_blocks`` are given; None if there is none."""
    candidates: list[Neuron] = [v for v in validators if now is None or max_idle_blocks is None
                            or (v.last_update > 0 and now - v.last_update <= max_idle_blocks)]
    return max(candidates, key=lambda n: (n.stake, -n.uid)) if candidates else None
