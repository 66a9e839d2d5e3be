"""Several OS processes on one LocalChain file: no lost writes, no 'database is locked', no corruption."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from chain_helpers import hk
from dso.chain.local import LocalChain
from dso.chain.local_burn import FREE_REGISTRATION
from dso.chain.wallets import dev_wallet
from repo import ROOT

WRITER = r"""
import sys, time
from dso.chain.local import LocalChain
from dso.chain.wallets import dev_wallet
from dso.chain.wallets import dev_wallet, hotkey_address
path, uri, n, start_at, big = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
chain = LocalChain.open(path)
wallet = dev_wallet(uri)
while time.time() < start_at:
    time.sleep(0.005)
chain.register(wallet)
i = 0
while n < 0 or i < n:
    chain.add_stake(hotkey_address(wallet), 1.0)
    chain.append_ledger(wallet, {"writer": uri, "i": i, "pad": "x" * big})
    chain.commit(wallet, f"{uri}-{i}")
    if i == 0:
        print("ready", flush=True)
    i += 1
print("done", flush=True)
"""


def _writer(path: Path, uri: str, n: int, start_at: float, big: int = 0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", WRITER, str(path), uri, str(n), str(start_at), str(big)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_two_processes_writing_at_once_lose_nothing(tmp_path):
    path = tmp_path / "chain.sqlite"
    chain = LocalChain.create(path, block_time=0.05, commit_interval_blocks=0, genesis=time.time() - 10,
                              **FREE_REGISTRATION)
    n = 100
    start_at = time.time() + 2.5  # both interpreters are up before either writes
    procs = [_writer(path, uri, n, start_at) for uri in ("//procA", "//procB")]
    outputs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
        assert "done" in out and "locked" not in err
    a, b = dev_wallet("//procA"), dev_wallet("//procB")
    graph = {n_.hotkey: n_ for n_ in chain.metagraph()}
    assert graph[hk(a)].stake == n and graph[hk(b)].stake == n
    ledger = chain.ledger()
    assert len(ledger) == 2 * n and chain.verify_ledger() == []
    for writer in ("//procA", "//procB"):  # each writer's records arrive in its own order
        assert [r["record"]["i"] for r in ledger if r["record"]["writer"] == writer] == list(range(n))
    assert set(chain.commitments().values()) == {f"//procA-{n - 1}", f"//procB-{n - 1}"}
    assert chain.integrity_check() == "ok"
    chain.close()


def test_a_killed_writer_never_leaves_the_file_corrupt(tmp_path):
    path = tmp_path / "chain.sqlite"
    LocalChain.create(path, block_time=0.05, commit_interval_blocks=0, genesis=time.time() - 10,
                      **FREE_REGISTRATION).close()
    for delay in (0.0, 0.15, 0.4):
        proc = _writer(path, f"//killed{delay}", -1, 0.0, big=200_000)  # endless large writes
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()
        chain = LocalChain.open(path)
        assert chain.integrity_check() == "ok"
        assert chain.verify_ledger() == []
        survivor = dev_wallet(f"//survivor{delay}")
        chain.register(survivor)  # the file still takes writes: no lock left behind
        chain.append_ledger(survivor, {"after_kill": delay})
        assert chain.ledger()[-1]["record"] == {"after_kill": delay}
        chain.close()

