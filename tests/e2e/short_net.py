"""The short local network the adversary tests share: 3 honest miners, the adversaries under test and one
validator.  By default 6-second windows (block_time 0.75) and a 2.5 s put window on two loaded cores, so the
honest miners keep up (with 4 s windows they skipped every other window) and copiers find uploads to copy;
the zoo test (test_adversaries.py) runs the conftest's 4-second windows instead."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sim import report as run_report
from sim.localnet import LocalNet, plan_nodes, wait_for


def run_short_network(root: Path, corpus: Path, hp: Any, adversaries: list[tuple[str, int]], windows: int,
                      while_up: Callable[[LocalNet], Any] = lambda net: None, *, eval_peers: int = 4,
                      put_window_seconds: float | None = 2.5, block_time: float = 0.75,
                      timeout: float = 420.0) -> tuple[dict, list[dict], Any]:
    """(run report, validator window lines, ``while_up(net)`` called once the windows ran, before the network
    stops).  ``put_window_seconds`` None keeps ``hp``'s."""
    hp.eval_peers = eval_peers
    if put_window_seconds is not None:
        hp.put_window_seconds = put_window_seconds
    net = LocalNet(root / "run", hp, plan_nodes(3, adversaries, 1), block_time=block_time,
                   corpus=str(corpus), cache_dir=str(root / "cache"))
    with net:
        net.prepare()
        net.start()
        # the windows asked for, in most of which every honest miner took part (on a loaded machine they join late:
        # the network runs on for them until the timeout)
        honest = [n for n in net.nodes if n.role == "miner" and n.behaviour == "honest"]
        def worked(lines: list[dict]) -> bool:
            return len(lines) >= windows and all(
                sum(line["rejections"].get(str(n.uid)) != "missing" for line in lines) >= windows - 4 for n in honest)
        wait_for(lambda: worked(net.validator_lines()) or bool(net.dead()), timeout=timeout, step=0.5)
        logs = {p.name: p.read_text()[-2000:] for p in net.logs.glob("*.log")}
        assert len(net.validator_lines()) >= windows and not net.dead(), logs
        validator = next(n for n in net.nodes if n.role == "validator")
        posted = net.chain.weights().get(validator.uid)
        lines = net.validator_lines()
        extra = while_up(net)
    peers = {n.uid: (n.name, n.behaviour) for n in net.nodes if n.role == "miner"}
    return run_report.build(lines, peers, posted), lines, extra
