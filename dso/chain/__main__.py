"""Inspect and administer a local chain.

    python -m dso.chain status [--path FILE]          metagraph, weights, ledger
    python -m dso.chain create [--path FILE] [--block-time 1.0 --tempo 10 ...]
    python -m dso.chain stake  --hotkey SS58 --amount 100 [--path FILE]
    python -m dso.chain fund   --hotkey SS58 --amount 5 [--path FILE]      balance that pays the registration burn
    python -m dso.chain wallet --wallet.name NAME --wallet.hotkey HOTKEY [--wallet.path DIR]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from rich.console import Console
from rich.table import Table

from dso.chain.base import ChainError
from dso.chain.local import LocalChain
from dso.chain.local_store import LocalChainParams
from dso.chain.wallets import WalletError, create_local_wallet, hotkey_address
from dso.config.schema import Config, WalletConfig


def _short(ss58: str) -> str:
    return f"{ss58[:6]}…{ss58[-4:]}"


def render_status(chain: LocalChain, console: Console) -> None:
    p = chain.params
    block = chain.block()
    console.print(f"[bold]local chain[/bold] {chain.path}  block {block}  "
                  f"({p.block_time:g} s/block, tempo {p.tempo}, "
                  f"next consensus at block {(block // p.tempo + 1) * p.tempo}; "
                  f"a registration burns {chain.registration_burn():.6g})")
    neurons = chain.metagraph()
    commitments = chain.commitments()
    table = Table(title=f"metagraph ({len(neurons)}/{p.max_uids} uids)")
    for column in ("uid", "hotkey", "stake", "permit", "incentive", "emission", "commitment"):
        table.add_column(column, justify="right" if column not in ("hotkey", "commitment") else "left")
    for n in neurons:
        commitment = commitments.get(n.uid, "")
        table.add_row(str(n.uid), _short(n.hotkey), f"{n.stake:g}", "yes" if n.validator_permit else "",
                      f"{n.incentive:.4f}", f"{n.emission:.3f}",
                      commitment if len(commitment) <= 32 else commitment[:31] + "…")
    console.print(table)
    weights = chain.weights()
    wtable = Table(title="weights (validator uid -> uid:weight, largest first)")
    wtable.add_column("validator", justify="right")
    wtable.add_column("weights")
    for v, row in weights.items():
        top = sorted(row.items(), key=lambda kv: -kv[1])
        wtable.add_row(str(v), "  ".join(f"{u}:{w:.3f}" for u, w in top[:12]) + ("  …" if len(top) > 12 else ""))
    console.print(wtable if weights else "no weights posted yet")
    problems = chain.verify_ledger()
    console.print(f"ledger: {len(chain.ledger())} records, "
                  + ("hash chain intact" if not problems else f"[red]{len(problems)} problem(s)[/red]: {problems[0]}"))


def main(argv: list[str] | None = None) -> int:
    default_path = Config().subtensor.localchain_path
    parser = argparse.ArgumentParser(prog="python -m dso.chain", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="print metagraph, weights and ledger length")
    create = sub.add_parser("create", help="create a local chain file")
    stake = sub.add_parser("stake", help="stake (or, negative, unstake) on a hotkey on the local chain")
    fund = sub.add_parser("fund", help="give a hotkey free balance (or, negative, take it back): registering burns it")
    for p in (status, create, stake, fund):
        p.add_argument("--path", default=default_path, help=f"chain file (default {default_path})")
    create.add_argument("--exist-ok", action="store_true", help="keep an existing chain instead of failing")
    for f in dataclasses.fields(LocalChainParams):
        if f.name != "genesis":
            create.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=type(f.default), default=None)
    for p in (stake, fund):
        p.add_argument("--hotkey", required=True, help="ss58 address")
        p.add_argument("--amount", required=True, type=float)
    wallet = sub.add_parser("wallet", help="create an unencrypted local wallet and print its hotkey")
    defaults = WalletConfig()
    wallet.add_argument("--wallet.name", dest="name", default=defaults.name)
    wallet.add_argument("--wallet.hotkey", dest="hotkey", default=defaults.hotkey)
    wallet.add_argument("--wallet.path", dest="wallet_path", default=defaults.path)
    args = parser.parse_args(argv)
    console = Console()
    try:
        if args.command == "wallet":
            w = create_local_wallet(args.name, args.hotkey, args.wallet_path)
            print(hotkey_address(w))
        elif args.command == "create":
            settings = {f.name: getattr(args, f.name) for f in dataclasses.fields(LocalChainParams)
                        if f.name != "genesis" and getattr(args, f.name) is not None}
            chain = LocalChain.create(args.path, exist_ok=args.exist_ok, genesis=time.time(), **settings)
            console.print(f"local chain at {chain.path}: {chain.params}")
        else:
            chain = LocalChain.open(args.path)
            if args.command == "stake":
                console.print(f"{args.hotkey} now holds {chain.add_stake(args.hotkey, args.amount):g}")
            elif args.command == "fund":
                console.print(f"{args.hotkey} now holds a balance of {chain.fund(args.hotkey, args.amount):g} "
                              f"(a registration burns {chain.registration_burn():.6g} now)")
            else:
                render_status(chain, console)
    except (ChainError, WalletError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
