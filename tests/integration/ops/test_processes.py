"""Children never outlive their parent (dso/util/processes.py), and a node stops within its grace time
(neurons/lifecycle.py).  The same on a whole local network: tests/e2e/test_operations.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dso.util import processes
from repo import ROOT

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that never comes, e.g. pid 1 in a container, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.time() + timeout
    while time.time() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


@pytest.mark.skipif(not processes.has_parent_death_signal(), reason="prctl(PR_SET_PDEATHSIG) is Linux only")
def test_a_child_dies_when_its_parent_is_killed_outright():
    parent = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from dso.util.processes import spawn\n"
        f"child = spawn({SLEEPER!r})\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n")], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        child = int(parent.stdout.readline())
        assert alive(child)
        assert os.getpgid(child) == child != os.getpgid(parent.pid)   # its own process group
        parent.kill()                                                 # SIGKILL: the parent cleans up nothing
        parent.wait()
        assert wait_gone([child], 5.0) == [], "the child outlived its SIGKILLed parent"
    finally:
        parent.kill()


def test_stop_asks_then_kills_the_whole_group():
    stubborn = processes.spawn([sys.executable, "-c", (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"grandchild = subprocess.Popen({SLEEPER!r})\n"     # same group, no parent-death signal of its own
        "print(grandchild.pid, flush=True)\n"
        "time.sleep(120)\n")], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    grandchild = int(stubborn.stdout.readline())
    started = time.monotonic()
    code = processes.stop(stubborn, timeout=1.0)
    assert code == -signal.SIGKILL and time.monotonic() - started < 5
    assert wait_gone([grandchild], 5.0) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_node_stuck_in_a_step_stops_within_its_grace_time(sig):
    """SIGTERM or SIGINT sets the stop flag; a step that does not return is interrupted after the grace time and the
    process exits 0 (its saved state is the last finished window's)."""
    node = subprocess.Popen([sys.executable, "-c", (
        "import time\n"
        "from neurons.lifecycle import StopFlag, run_main\n"
        "def main():\n"
        "    stop = StopFlag(grace=1.0)\n"
        "    print('ready', flush=True)\n"
        "    while True:\n"                               # a step that never looks at the flag
        "        sum(range(10000))\n"
        "run_main(main)\n")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert node.stdout.readline().strip() == "ready"
    started = time.monotonic()
    node.send_signal(sig)
    try:
        code = node.wait(15)
    finally:
        node.kill()
    took = time.monotonic() - started
    err = node.stderr.read()
    assert code == 0, err
    assert 0.9 <= took < 10, took
    assert "interrupting the current step" in err and "last finished window" in err
