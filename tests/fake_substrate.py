"""An in-memory subtensor behind the SDK's ``Substrate`` protocol (the ``substrate=`` offline seam).

It answers the storage items and runtime call BittensorChain reads, in the
decoded shapes the SDK's transport hands back, and applies the two extrinsics
it writes (``Commitments.set_commitment``, ``SubtensorModule.set_mechanism_weights``)
so a write can be read back through the real SDK decoding paths.  Blocks
advance with wall time (``block_time`` seconds each) from ``head`` at creation.
"""
from __future__ import annotations

import time
from typing import Any

from bittensor import ExtrinsicResult
from bittensor.balance import Balance

RAO = 10**9
U16 = 65535


class FakeSubstrate:
    def __init__(self, *, head: int = 1000, netuid: int = 3, block_time: float = 12.0,
                 genesis_ms: int | None = None):
        self._start_head, self._start_time = head, time.time()
        self.netuid, self.block_time_s = netuid, block_time
        # block b is stamped genesis + b * block_time, with the current head "now"
        self.genesis_ms = genesis_ms if genesis_ms is not None else int((self._start_time - head * block_time) * 1000)
        self.frozen: int | None = head if block_time >= 1 else None  # slow chains stand still in tests
        self.token_symbols: dict[int, str] = {}
        self.hotkeys: list[str] = []
        self.stake_rao: dict[str, int] = {}
        self.incentive_u16: dict[str, int] = {}
        self.emission_rao: dict[str, int] = {}
        self.commitment_of: dict[str, dict] = {}
        self.revealed: list[tuple[str, list]] = []
        self.weight_rows: dict[int, list[tuple[int, int]]] = {}
        self.submitted: list[tuple[Any, str]] = []
        self.subnet_exists = True
        self.hyper: dict[str, Any] = {}          # SubtensorModule item name -> value for this netuid
        self.last_update: dict[str, int] = {}    # hotkey -> block of its last weight post
        self.blocks_decoded = 0                  # get_block calls (a whole block fetched and decoded)
        self.keeps_hashes = 4096                 # System.BlockHash holds this many recent blocks
        self.read_at: list[tuple[str, int]] = []  # (metagraph | commitments, the block the read was pinned to)

    # -------------------------------------------------------------- set-up
    def add_neuron(self, hotkey: str, *, stake_tao: float = 0.0, incentive: float = 0.0,
                   emission_tao: float = 0.0) -> int:
        self.hotkeys.append(hotkey)
        self.stake_rao[hotkey] = int(stake_tao * RAO)
        self.incentive_u16[hotkey] = round(incentive * U16)
        self.emission_rao[hotkey] = int(emission_tao * RAO)
        return len(self.hotkeys) - 1

    @property
    def head(self) -> int:
        if self.frozen is not None:
            return self.frozen
        return self._start_head + int((time.time() - self._start_time) / self.block_time_s)

    def _graph(self) -> dict:
        hk = self.hotkeys
        return {"netuid": self.netuid, "hotkeys": hk, "coldkeys": hk, "block": self.head, "tempo": 360,
                "last_step": 0, "blocks_since_last_step": 1, "owner_hotkey": hk[0] if hk else "",
                "owner_coldkey": hk[0] if hk else "", "network_registered_at": 1,
                "validator_permit": [self.stake_rao[h] > 0 for h in hk],
                "incentives": [self.incentive_u16[h] for h in hk],
                "last_update": [self.last_update.get(h, 0) for h in hk],
                "emission": [self.emission_rao[h] for h in hk],
                "total_stake": [self.stake_rao[h] for h in hk]}

    # ------------------------------------------------------ Substrate API
    def balance(self, rao: int, netuid: int = 0) -> Balance:
        return Balance.from_rao(rao, netuid)

    async def connect(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def block_number(self) -> int:
        return self.head

    async def block_hash(self, block: int | None = None) -> str:
        return "0x" + (self.head if block is None else block).to_bytes(32, "big")[::-1].hex()

    async def block_time(self) -> float:
        return self.block_time_s

    async def get_block(self, block_number=None, block_hash=None) -> dict | None:
        number = self.head if block_number is None else block_number
        self.blocks_decoded += 1
        if number > self.head:
            return None
        return {"header": {"number": number, "hash": await self.block_hash(number)}, "extrinsics": []}

    def _block_of(self, block_hash: str | None) -> int:
        return self.head if block_hash is None else int.from_bytes(bytes.fromhex(block_hash[2:])[::-1], "big")

    async def query(self, module: str, name: str, params=None, block_hash=None) -> Any:
        if (module, name) == ("SubtensorModule", "Uids"):
            return self.hotkeys.index(params[1]) if params[1] in self.hotkeys else None
        if (module, name) == ("Timestamp", "Now"):
            return self.genesis_ms + int(self.block_time_s * 1000) * self._block_of(block_hash)
        if (module, name) == ("Commitments", "CommitmentOf"):
            return self.commitment_of.get(params[1])
        if (module, name) == ("System", "BlockHash"):
            kept = 0 <= self.head - params[0] < self.keeps_hashes or params[0] == 0
            return await self.block_hash(params[0]) if kept else "0x" + "00" * 32
        if module == "SubtensorModule" and params == [self.netuid] and name in self.hyper:
            return self.hyper[name]
        return None  # every other item (the rest of SetWeights' preflight): unset

    async def query_map(self, module: str, name: str, params=None, block_hash=None) -> list:
        if (module, name) == ("Commitments", "CommitmentOf"):
            self.read_at.append(("commitments", self._block_of(block_hash)))
            return list(self.commitment_of.items())
        if (module, name) == ("Commitments", "RevealedCommitments"):
            return list(self.revealed)
        if (module, name) == ("SubtensorModule", "Uids"):
            return [(h, uid) for uid, h in enumerate(self.hotkeys)]
        if (module, name) == ("SubtensorModule", "Weights"):
            return list(self.weight_rows.items())
        return []

    async def query_batch(self, module, name, param_sets, block_hash=None) -> list:
        return [await self.query(module, name, p, block_hash) for p in param_sets]

    async def runtime_call(self, api: str, method: str, params: list, block_hash=None) -> Any:
        if (api, method) == ("SubnetInfoRuntimeApi", "get_metagraph") and params[0] == self.netuid:
            self.read_at.append(("metagraph", self._block_of(block_hash)))
            return self._graph() if self.subnet_exists else None
        return None

    async def compose(self, call) -> Any:
        return call

    async def submit(self, call, keypair, **kwargs) -> ExtrinsicResult:
        hotkey = keypair.ss58_address
        self.submitted.append((call, hotkey))
        if (call.module, call.function) == ("Commitments", "set_commitment"):
            # the transport decodes Raw<n> payloads as 0x-hex strings
            fields = [{k: "0x" + bytes(v).hex()} for f in call.params["info"]["fields"] for k, v in f.items()]
            self.commitment_of[hotkey] = {"block": self.head, "deposit": 0, "info": {"fields": fields}}
        elif (call.module, call.function) == ("SubtensorModule", "set_mechanism_weights"):
            row = list(zip(call.params["dests"], call.params["weights"], strict=True))
            self.weight_rows[self.hotkeys.index(hotkey)] = row
            self.last_update[hotkey] = self.head
        return ExtrinsicResult(success=True, message="included")
