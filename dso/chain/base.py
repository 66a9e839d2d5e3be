"""The one view of a chain the rest of the code uses.

Backends: :class:`dso.chain.local.LocalChain` (embedded SQLite, the default) and
:class:`dso.chain.bittensor_chain.BittensorChain` (the real network).  Every
write is made with a wallet whose hotkey must be registered; refusals raise
:class:`ChainError` with a reason the caller can log.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dso.chain.weights import WeightPlan


# How far back a node may read the chain's state: a pruning (lite) subtensor node keeps the state of
# the last 256 blocks; the local chain keeps as much (dso.chain.local_epochs prunes only older rows).
STATE_HISTORY_BLOCKS = 256


class ChainError(RuntimeError):
    """A chain call was refused or failed; ``reason`` is a short code, the message says why."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class ChainUnavailable(ChainError):
    """No chain to talk to (e.g. the local network is not running)."""

    def __init__(self, message: str):
        super().__init__("unavailable", message)


@dataclass(frozen=True)
class Neuron:
    uid: int
    hotkey: str            # ss58 address
    stake: float
    validator_permit: bool
    incentive: float       # share of incentive from the last consensus, sums to 1 over uids (or 0)
    emission: float = 0.0  # accrued emission (local chain) or last emission (real chain)
    last_update: int = 0   # block of the neuron's last weight post (or commit) since registering; 0 = never


@dataclass(frozen=True)
class WeightRules:
    """What the chain accepts as a weight post (subnet hyperparameters on the real chain)."""

    rate_limit_blocks: int = 0      # a hotkey posts at most once per this many blocks (0 = no limit)
    min_allowed_weights: int = 0    # posts with fewer positive weights are refused (capped at the subnet size)
    max_weight_limit: float = 1.0   # no normalised weight above this share; the row is clipped to it
    version_key: int = 0            # posts with a lower version key are refused
    commit_reveal: bool = False     # weights are committed now and revealed (read back) later
    reveal_period_epochs: int = 0   # epochs between commit and reveal when commit_reveal is on


class Chain(ABC):
    weights_version: int = 0  # version key posted with weights unless given (set from config by open_chain)

    @abstractmethod
    def block(self) -> int:
        """Current block height."""

    @abstractmethod
    def block_timestamp(self, block: int) -> float:
        """Unix time (seconds) of a block; for future blocks, the scheduled time."""

    @abstractmethod
    def randomness(self, block: int) -> bytes:
        """32 bytes no peer could know before ``block`` was produced (e.g. its hash)."""

    @abstractmethod
    def metagraph(self, block: int | None = None) -> list[Neuron]:
        """All registered neurons, by uid: now, or as the chain stood at a produced ``block`` no more than
        :data:`STATE_HISTORY_BLOCKS` old (stake, permits and last updates; incentive and emission are the
        latest consensus's)."""

    @abstractmethod
    def register(self, wallet: Any) -> int:
        """Register the wallet's hotkey (idempotent); returns its uid."""

    @abstractmethod
    def commit(self, wallet: Any, data: str) -> None:
        """Publish a commitment string for the wallet's hotkey."""

    @abstractmethod
    def commitments(self, block: int | None = None) -> dict[int, str]:
        """uid → latest commitment string, for every uid that has one (now, or as of a produced ``block``)."""

    @abstractmethod
    def set_weights(self, wallet: Any, uids: list[int], weights: list[float],
                    version_key: int | None = None) -> None:
        """Post a validator's weights (normalised by the chain).  ``version_key`` None = this
        connection's :attr:`weights_version` (from ``--subtensor.weights_version``)."""

    @abstractmethod
    def weights(self) -> dict[int, dict[int, float]]:
        """validator uid → {uid: normalised weight} as last posted."""

    # ---------------------------------------------------------- helpers
    def uid_of(self, hotkey: str) -> int | None:
        for n in self.metagraph():
            if n.hotkey == hotkey:
                return n.uid
        return None

    def commitment(self, uid: int) -> str | None:
        return self.commitments().get(uid)

    def leading_validator(self) -> Neuron | None:
        """The highest-staked neuron with a validator permit (ties: lowest uid)."""
        validators = [n for n in self.metagraph() if n.validator_permit]
        return max(validators, key=lambda n: (n.stake, -n.uid)) if validators else None

    def weight_rules(self) -> WeightRules:
        """The rules a weight post must meet; the default: none."""
        return WeightRules()

    def protocol_validators(self, block: int | None = None) -> list[Neuron]:
        """Permit holders whose commitment carries the validator role tag (dso.chain.roles), by stake
        (largest first, ties: lower uid), each with its stake and last update (now, or as of ``block``)."""
        from dso.chain.roles import VALIDATOR, role_of

        commitments = self.commitments(block)
        tagged = [n for n in self.metagraph(block)
                  if n.validator_permit and role_of(commitments.get(n.uid)) == VALIDATOR]
        return sorted(tagged, key=lambda n: (-n.stake, n.uid))

    def leading_protocol_validator(self, max_idle_blocks: int | None = None,
                                   block: int | None = None) -> Neuron | None:
        """The largest-stake protocol validator; with ``max_idle_blocks``, only among those that posted
        weights within that many blocks (a stopped leader hands over).  With ``block``, as the chain stood
        then: every node that asks about the same block gets the same answer, whenever it asks."""
        from dso.chain.roles import pick_leader

        now = self.block() if block is None else block
        return pick_leader(self.protocol_validators(block), now if max_idle_blocks is not None else None,
                           max_idle_blocks)

    def post_weights(self, wallet: Any, scores: dict[int, float], *, pad: bool = True,
                     version_key: int | None = None) -> WeightPlan:
        """Post ``scores`` as the chain will accept them (dso.chain.weights.plan_weights: version key,
        rate limit, minimum count with padding, clip); returns the WeightPlan posted, or raises
        WeightsRefused (a ChainError whose ``refusal`` says why and from which block a post is allowed)."""
        from dso.chain.wallets import WalletError, hotkey_address
        from dso.chain.weights import WeightRefusal, WeightsRefused, plan_weights

        try:
            hotkey = hotkey_address(wallet)
        except WalletError as e:
            raise ChainError("bad_input", str(e)) from None
        graph = self.metagraph()
        me = next((n for n in graph if n.hotkey == hotkey), None)
        if me is None:
            raise ChainError("not_registered", f"hotkey {hotkey} is not registered")
        plan = plan_weights(scores, self.weight_rules(), registered=[n.uid for n in graph], own_uid=me.uid,
                            version_key=self.weights_version if version_key is None else version_key,
                            last_update=me.last_update, now=self.block(), pad=pad)
        if isinstance(plan, WeightRefusal):
            raise WeightsRefused(plan)
        self.set_weights(wallet, plan.uids, plan.weights, plan.version_key)
        return plan

    def close(self) -> None:  # noqa: B027 — an optional hook, not abstract: the default has nothing to release
        """Release connections; the default has none."""

    # ------------------------------------------ provenance ledger (optional)
    def append_ledger(self, wallet: Any, record: dict[str, Any]) -> str:
        """Append a signed, hash-linked provenance record; returns its hash."""
        raise ChainError("unsupported", f"{type(self).__name__} keeps no provenance ledger")

    def ledger(self) -> list[dict[str, Any]]:
        """Valid records in order: {seq, block, hotkey, prev_hash, hash, record}."""
        raise ChainError("unsupported", f"{type(self).__name__} keeps no provenance ledger")

    def verify_ledger(self) -> list[str]:
        """Problems in the hash chain; an empty list means intact."""
        raise ChainError("unsupported", f"{type(self).__name__} keeps no provenance ledger")
