"""The short local network the issue-17 adversary tests share: 3 honest miners, the adversaries under test and
one validator, 6-second windows (block_time 0.75) and a 2.5 s put window on two loaded cores, so the honest
miners keep up (with 4 s windows they skipped every other window) and copiers find uploads to copy."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from sim import report as run_report
from sim.localnet import LocalNet, plan_nodes, wait_for


def run_short_network(root: Path, corpus: Path, hp: Any, adversaries: list[tuple[str, int]], windows: int,
                      while_up: Callable[[LocalNet], Any] = lambda net: None) -> tuple[dict, list[dict], Any]:
    """(run report, validator window lines, ``while_up(net)`` called once the windows ran, before the network
    stops)."""
    hp.eval_peers, hp.put_window_seconds = 4, 2.5
    net = LocalNet(root / "run", hp, plan_nodes(3, adversaries, 1), block_time=0.75,
                   corpus=str(corpus), cache_dir=str(root / "cache"))
    with net:
        net.prepare()
        net.start()
        done = wait_for(lambda: len(net.validator_lines()) >= windows or bool(net.dead()), timeout=420, step=0.5)
        assert done and not net.dead(), {p.name: p.read_text()[-2000:] for p in net.logs.glob("*.log")}
        validator = next(n for n in net.nodes if n.role == "validator")
        posted = net.chain.weights().get(validator.uid)
        lines = net.validator_lines()
        extra = while_up(net)
    peers = {n.uid: (n.name, n.behaviour) for n in net.nodes if n.role == "miner"}
    return run_report.build(lines, peers, posted), lines, extra
