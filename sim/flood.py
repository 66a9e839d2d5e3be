"""A registration flood on the local chain: what it costs the attacker and whom it keeps out (experiments only).

One validator (a permit) and one honest miner register first.  From the next block an attacker registers a
fresh hotkey every block for as long as its budget pays the burn; a newcomer with a small budget tries to
register every ``newcomer_every`` blocks and, once in, earns the validator's weight like the honest miner
(the validator posts every ``post_every`` blocks).  Run on :class:`dso.chain.local.LocalChain` with its own
clock, so the outcome is exact and the same on every machine.  ``scripts/benchmarks/flood.py`` reports it;
``tests/unit/chain/test_local_chain_burn.py`` checks it.
"""
from __future__ import annotations

import hashlib
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import bittensor_core

from dso.chain.base import ChainError
from dso.chain.local import LocalChain
from dso.chain.local_burn import FREE_REGISTRATION
from dso.chain.wallets import DevWallet, hotkey_address


def _wallet(name: str) -> DevWallet:
    """A development wallet from a seed (30x faster to make than a ``//name`` derivation: thousands per run)."""
    key = bittensor_core.Keypair.create_from_seed(hashlib.sha256(f"dso-flood/{name}".encode()).digest())
    return DevWallet(hotkey=key, coldkey=key)


class StepClock:
    """Wall time that moves only when told (genesis 0, so block = floor(t / block_time))."""

    def __init__(self) -> None:
        self.t = 1.0

    def __call__(self) -> float:
        return self.t


@dataclass
class FloodOutcome:
    blocks: int
    burn: bool                       # whether registrations burned anything
    attacker_budget: float
    sybils_registered: int = 0
    attacker_spent: float = 0.0
    newcomer_tries: int = 0
    newcomers_admitted: int = 0
    newcomers_evicted: int = 0       # admitted, then replaced by a later registration
    refusals: dict[str, int] = field(default_factory=dict)  # newcomers' refusals by reason
    validator_evicted: bool = False
    honest_miner_evicted: bool = False
    peak_burn: float = 0.0
    final_burn: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_flood(*, blocks: int = 3000, max_uids: int = 32, burn: bool = True, attacker_budget: float = 500.0,
              newcomer_budget: float = 5.0, newcomer_every: int = 25, post_every: int = 100,
              chain_dir: Path | None = None, **settings: Any) -> FloodOutcome:
    """Run the flood for ``blocks`` blocks (1 s each) and count what happened; ``settings``: further
    LocalChainParams (e.g. ``immunity_blocks``)."""
    clock = StepClock()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(chain_dir or tmp) / "flood.sqlite"
        chain = LocalChain.create(path, clock=clock, genesis=0.0, block_time=1.0, max_uids=max_uids,
                                  **(settings if burn else {**FREE_REGISTRATION, **settings}))
        try:
            return _flood(chain, clock, blocks, burn, attacker_budget, newcomer_budget, newcomer_every, post_every)
        finally:
            chain.close()


def _pay_and_register(chain: LocalChain, wallet: Any, budget: float) -> tuple[int | None, float, str]:
    """(uid or None, what it cost, refusal reason or "") for a registrant holding ``budget``."""
    hotkey = hotkey_address(wallet)
    price = chain.registration_burn()
    if price > budget:
        return None, 0.0, "insufficient_balance"
    if price > 0:
        chain.fund(hotkey, price)
    try:
        return chain.register(wallet), price, ""
    except ChainError as e:
        if price > 0:
            chain.fund(hotkey, -chain.balance(hotkey))  # not spent: the registrant keeps it
        return None, 0.0, e.reason


def _flood(chain: LocalChain, clock: StepClock, blocks: int, burn: bool, attacker_budget: float,
           newcomer_budget: float, newcomer_every: int, post_every: int) -> FloodOutcome:
    out = FloodOutcome(blocks=blocks, burn=burn, attacker_budget=attacker_budget)
    validator, miner = _wallet("validator"), _wallet("miner")
    for wallet in (validator, miner):
        _pay_and_register(chain, wallet, float("inf"))
    chain.add_stake(hotkey_address(validator), 100.0)
    earners = [hotkey_address(miner)]     # the honest miner and every admitted newcomer
    admitted: list[str] = []
    budget, start = attacker_budget, chain.block()
    for step in range(1, blocks + 1):
        clock.t += 1.0
        uid, cost, _ = _pay_and_register(chain, _wallet(f"sybil{step}"), budget)
        if uid is not None:
            out.sybils_registered += 1
            budget -= cost
            out.attacker_spent += cost
        if step % newcomer_every == 0:
            out.newcomer_tries += 1
            wallet = _wallet(f"newcomer{step}")
            uid, _, reason = _pay_and_register(chain, wallet, newcomer_budget)
            if uid is None:
                out.refusals[reason] = out.refusals.get(reason, 0) + 1
            else:
                out.newcomers_admitted += 1
                admitted.append(hotkey_address(wallet))
                earners.append(hotkey_address(wallet))
        out.peak_burn = max(out.peak_burn, chain.registration_burn())
        if step % post_every == 0:
            _post(chain, validator, earners)
    registered = {n.hotkey for n in chain.metagraph()}
    out.validator_evicted = hotkey_address(validator) not in registered
    out.honest_miner_evicted = hotkey_address(miner) not in registered
    out.newcomers_evicted = sum(hk not in registered for hk in admitted)
    out.final_burn = chain.registration_burn()
    assert chain.block() == start + blocks
    return out


def _post(chain: LocalChain, validator: Any, earners: list[str]) -> None:
    """The validator weights every registered earner equally (sybils earn nothing)."""
    uids = [n.uid for n in chain.metagraph() if n.hotkey in earners]
    if uids:
        chain.set_weights(validator, uids, [1.0] * len(uids))


def main(argv: list[str] | None = None) -> int:
    """``python -m sim.flood [--blocks N --max-uids N --attacker-budget X --newcomer-budget X ...]``: the flood free
    and with the burn, one JSON line each (the real chain's registration settings unless given)."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=12_000)
    parser.add_argument("--max-uids", type=int, default=256)
    parser.add_argument("--immunity-blocks", type=int, default=4096)
    parser.add_argument("--attacker-budget", type=float, default=2000.0)
    parser.add_argument("--newcomer-budget", type=float, default=10.0)
    parser.add_argument("--newcomer-every", type=int, default=50)
    args = parser.parse_args(argv)
    for burn in (False, True):
        outcome = run_flood(blocks=args.blocks, max_uids=args.max_uids, burn=burn,
                            attacker_budget=args.attacker_budget, newcomer_budget=args.newcomer_budget,
                            newcomer_every=args.newcomer_every, immunity_blocks=args.immunity_blocks)
        print(json.dumps(outcome.to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
