"""BittensorChain: the Chain interface on a real Subtensor network, through the bittensor SDK v11.

Selected with ``--subtensor.network`` (``finney``, ``test``, ``local`` or a
``ws://``/``wss://`` URL) and ``--netuid``.  Mapping of each call:

=================  ==========================================================
block              ``Subtensor.block``
block_timestamp    ``Subtensor.timestamp(block)`` (Timestamp pallet); future
                   blocks: head time + blocks x ``block_time()``
randomness         hash of the block: storage ``System.BlockHash[b]`` (one read,
                   no block decoding); ``block_info(b).hash`` only for blocks
                   older than the chain keeps hashes of (~4096)
metagraph          ``subnets.metagraph(netuid, commitments=False)`` (with
                   ``last_update``)
weight_rules       storage ``WeightsSetRateLimit``, ``MinAllowedWeights``,
                   ``MaxWeightsLimit``, ``WeightsVersionKey``,
                   ``CommitRevealWeightsEnabled``, ``RevealPeriodEpochs``
register           uid lookup; ``BurnedRegister`` only if explicitly allowed
commit             ``submit_call(calls.Commitments.set_commitment, signer=hotkey)``
commitments        ``subnets.commitments(netuid)`` (visible value per uid)
set_weights        ``execute(SetWeights(version_key=...))`` — what
                   ``bt.set_weights`` does, on this connection (the SDK picks
                   plain or commit-reveal); the version key from config
weights            the ``weights`` read (rows normalised to sum 1)
=================  ==========================================================

SDK failures become :class:`ChainError` (reason from the SDK's error code) or
:class:`ChainUnavailable` (connection problems), so callers handle one type.
The provenance ledger is local-only (ChainError 'unsupported').
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import bittensor as bt

from dso.chain import rules
from dso.chain.base import Chain, ChainError, ChainUnavailable, Neuron, WeightRules
from dso.chain.local_store import check_block
from dso.chain.wallets import WalletError, hotkey_address

_REASON_OF_CODE = {"rate_limited": rules.RATE_LIMITED, "not_registered": rules.NOT_REGISTERED}
_REASON_OF_NAME = {"SpaceLimitExceeded": rules.RATE_LIMITED,  # commitment bytes per epoch used up
                   "NeuronNoValidatorPermit": rules.NO_PERMIT,
                   "SettingWeightsTooFast": rules.RATE_LIMITED,
                   "IncorrectWeightVersionKey": rules.OUTDATED_VERSION,
                   "WeightVecLengthIsLow": rules.TOO_FEW_WEIGHTS,
                   "MaxWeightExceeded": rules.BAD_WEIGHTS}
_U16_MAX = 65535
_ZERO_HASH = "0x" + "00" * 32


class BittensorChain(Chain):
    """A subnet on a Subtensor network.  ``client`` injects a ready ``bt.SyncClient`` (tests use
    ``bt.SyncClient(network, substrate=fake)``, the SDK's offline seam)."""

    def __init__(self, network: str = "finney", netuid: int = 1, *, client: Any = None,
                 allow_burned_register: bool = False, weights_version: int = 0):
        if not rules.is_int(netuid) or netuid < 0:
            raise ChainError(rules.BAD_INPUT, f"netuid must be an integer >= 0, got {netuid!r}")
        try:
            self.sub = client if client is not None else bt.Subtensor(network)  # connects lazily
        except ValueError as e:
            raise ChainError(rules.BAD_INPUT, f"--subtensor.network: {e}") from None
        self.network, self.netuid = network, int(netuid)
        self.allow_burned_register = allow_burned_register
        self.weights_version = int(weights_version)
        self._seconds_per_block: float | None = None

    def __repr__(self) -> str:
        return f"BittensorChain(network={self.network!r}, netuid={self.netuid})"

    @contextmanager
    def _sdk(self, what: str) -> Iterator[None]:
        """Translate SDK and transport failures into the Chain error vocabulary."""
        try:
            yield
        except ChainError:
            raise
        except (bt.RpcConnectionError, bt.ConnectionNotReady, OSError, TimeoutError, asyncio.TimeoutError) as e:
            raise ChainUnavailable(f"{what} on {self.network}: {e}") from None
        except bt.ChainError as e:
            code = getattr(e.code, "value", None) or "chain"
            reason = _REASON_OF_NAME.get(e.name or "", _REASON_OF_CODE.get(code, code))
            raise ChainError(reason, f"{what} on {self.network} refused: {e}") from None
        except WalletError as e:
            raise ChainError(rules.BAD_INPUT, f"{what}: {e}") from None
        except Exception as e:  # an SDK decoding surprise must not kill a long-running neuron
            raise ChainError("chain", f"{what} on {self.network} failed: {type(e).__name__}: {e}") from None

    # --------------------------------------------------------------- time
    def block(self) -> int:
        with self._sdk("reading the current block"):
            return int(self.sub.block)

    def seconds_per_block(self) -> float:
        """12 s on finney/test, 0.25 s on a fast-blocks local subtensor (read once from the chain)."""
        if self._seconds_per_block is None:
            with self._sdk("reading the block time"):
                self._seconds_per_block = float(self.sub.block_time())
        return self._seconds_per_block

    def block_timestamp(self, block: int) -> float:
        block = check_block(block)
        with self._sdk(f"reading the timestamp of block {block}"):
            head = int(self.sub.block)
            if block <= head:
                stamp: float = self.sub.timestamp(block).timestamp()
                return stamp
            head_stamp: float = self.sub.timestamp(head).timestamp()
            return head_stamp + (block - head) * self.seconds_per_block()

    def randomness(self, block: int) -> bytes:
        block = check_block(block)
        with self._sdk(f"reading the hash of block {block}"):
            head = int(self.sub.block)
            if block > head:
                raise ChainError(rules.FUTURE_BLOCK, f"block {block} is not produced yet (now {head})")
            value = self.sub.query(bt.storage.System.BlockHash, [block])
            text = value.hex() if isinstance(value, (bytes, bytearray)) else str(value or "")
            if not text.removeprefix("0x").strip("0"):  # older than the hashes the chain keeps
                text = str(getattr(self.sub.block_info(block), "hash", "") or "")
            digest = bytes.fromhex(text.removeprefix("0x"))
        if len(digest) != 32:
            raise ChainError("chain", f"block {block} has no 32-byte hash on {self.network}")
        return digest

    # ---------------------------------------------------------- metagraph
    def metagraph(self, block: int | None = None) -> list[Neuron]:
        with self._sdk(f"reading the metagraph of netuid {self.netuid}"):
            graph = self.sub.subnets.metagraph(self.netuid, block=block, commitments=False)
            if graph is None:
                raise ChainError("no_subnet", f"netuid {self.netuid} does not exist on {self.network}")
            return [Neuron(uid=int(n.uid), hotkey=str(n.hotkey), stake=float(n.total_stake.amount),
                           validator_permit=bool(n.validator_permit), incentive=float(n.incentive),
                           emission=float(n.emission.amount), last_update=int(n.last_update or 0))
                    for n in graph.neurons]

    def weight_rules(self) -> WeightRules:
        """The subnet's weight hyperparameters (unset items read as the chain's neutral values)."""
        item = bt.storage.SubtensorModule

        def read(name: str) -> int:
            value = self.sub.query(getattr(item, name), [self.netuid])
            return int(value or 0)
        with self._sdk(f"reading the weight hyperparameters of netuid {self.netuid}"):
            max_limit = self.sub.query(item.MaxWeightsLimit, [self.netuid])
            return WeightRules(rate_limit_blocks=read("WeightsSetRateLimit"),
                               min_allowed_weights=read("MinAllowedWeights"),
                               max_weight_limit=(int(max_limit) if max_limit is not None else _U16_MAX) / _U16_MAX,
                               version_key=read("WeightsVersionKey"),
                               commit_reveal=bool(self.sub.query(item.CommitRevealWeightsEnabled, [self.netuid])),
                               reveal_period_epochs=read("RevealPeriodEpochs"))

    def uid_of(self, hotkey: str) -> int | None:
        with self._sdk("looking up a uid"):
            uid = self.sub.neurons.uid(hotkey, self.netuid)
        return None if uid is None else int(uid)

    def register(self, wallet: Any) -> int:
        with self._sdk("registering"):
            hotkey = hotkey_address(wallet)
        uid = self.uid_of(hotkey)
        if uid is not None:
            return uid
        if not self.allow_burned_register:
            raise ChainError(rules.NOT_REGISTERED,
                             f"hotkey {hotkey} is not registered on netuid {self.netuid} ({self.network}); "
                             f"registration costs TAO: run `btcli subnets register --netuid {self.netuid}` first")
        with self._sdk("burned registration"):
            self.sub.execute(bt.BurnedRegister(netuid=self.netuid), wallet).raise_for_failure()
        uid = self.uid_of(hotkey)
        if uid is None:
            raise ChainError(rules.NOT_REGISTERED, f"registration of {hotkey} did not yield a uid")
        return uid

    # -------------------------------------------------------- commitments
    def commit(self, wallet: Any, data: str) -> None:
        """Publish ``data`` as up to three ``Raw`` fields (<= 384 ASCII bytes), signed by the hotkey."""
        fields = rules.commitment_fields(data)
        with self._sdk("committing"):
            current = self.sub.identity.commitment(self.netuid, hotkey_address(wallet))
            if current is not None and getattr(current, "data", None) == data:
                return  # unchanged: save the fee and the per-epoch commitment space
            call = bt.calls.Commitments.set_commitment(netuid=self.netuid, info={"fields": fields})
            self.sub.submit_call(call, wallet, signer="hotkey").raise_for_failure()

    def commitments(self, block: int | None = None) -> dict[int, str]:
        with self._sdk(f"reading the commitments of netuid {self.netuid}"):
            rows = self.sub.subnets.commitments(self.netuid, block=block)
            out = {int(c.uid): c.value for c in rows.values() if c.uid is not None and c.value}
        return dict(sorted(out.items()))

    # ------------------------------------------------------------ weights
    def set_weights(self, wallet: Any, uids: list[int], weights: list[float],
                    version_key: int | None = None) -> None:
        normalised = rules.normalise_weights(uids, weights)
        version = self.weights_version if version_key is None else version_key
        if not rules.is_int(version) or version < 0:
            raise ChainError(rules.BAD_INPUT, f"version_key must be an integer >= 0, got {version!r}")
        intent = bt.SetWeights(netuid=self.netuid, uids=list(normalised), weights=list(normalised.values()),
                               version_key=int(version))
        with self._sdk("setting weights"):
            self.sub.execute(intent, wallet).raise_for_failure()

    def weights(self) -> dict[int, dict[int, float]]:
        with self._sdk(f"reading the weights of netuid {self.netuid}"):
            rows = self.sub.read("weights", netuid=self.netuid)
            return {int(v): {int(u): float(w) for u, w in row.items()} for v, row in rows.items() if row}

    def close(self) -> None:
        try:
            self.sub.close()
        except Exception:  # closing an unused or already-closed client has nothing to release
            pass
