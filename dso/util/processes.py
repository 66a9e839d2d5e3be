"""Child processes that never outlive the process that started them.

Every long-running child (a node of the local network, the embedded S3 server, a headless browser)
is started by :func:`spawn`: in its own process group, so one signal reaches it and whatever it starts,
and — on Linux — with a parent-death signal (``prctl(PR_SET_PDEATHSIG)``), so the kernel sends it
SIGTERM the moment its parent dies, even when the parent is SIGKILLed and cleans up nothing.
:func:`stop` asks a child's group to stop (SIGTERM), waits, then SIGKILLs what is left.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any, Protocol

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class Child(Protocol):
    """What stopping a child needs: a ``subprocess.Popen``, or a child of the fork server
    (dso/util/fork_server.py)."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    return libc.prctl


_PRCTL = _prctl()  # looked up once in the parent: the child between fork and exec should do little


def die_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> None:
    """In a freshly forked child: ask the kernel for ``sig`` when the parent dies.  The parent may already
    be gone by the time this runs: then the child signals itself.  No-op where prctl does not exist."""
    if _PRCTL is None:
        return
    _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)


def has_parent_death_signal() -> bool:
    return _PRCTL is not None


def spawn(cmd: list[str], *, nice: int = 0, death_signal: int = signal.SIGTERM,
          before_exec: Callable[[], None] | None = None, **popen: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen`` in a new session (own process group) that dies with this process; ``before_exec``
    runs in the child last.  The parent-death signal is tied to the thread that forks: call this from a
    thread that lives as long as the child should (the main thread, in practice)."""
    parent = os.getpid()

    def in_child() -> None:
        if nice:
            os.nice(nice)
            autogroup_nice(nice)
        die_with_parent(parent, death_signal)
        if before_exec is not None:
            before_exec()

    return subprocess.Popen(cmd, start_new_session=True, preexec_fn=in_child, **popen)


def autogroup_nice(nice: int) -> None:
    """Give the calling process's autogroup this nice value (Linux with ``sched_autogroup``; best effort).

    A new session gets its own autogroup, and the scheduler shares the CPU fairly between autogroups
    before it looks at the nice values inside them: without this, a niced child in its own session gets
    as much CPU as any other (measured: two busy children on one core, nice 0 and nice 10, each got half)."""
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:
        pass


def signal_group(process: Child, sig: int) -> None:
    """Send ``sig`` to the child's process group (it leads it: see :func:`spawn`)."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop(process: Child, timeout: float, sig: int = signal.SIGTERM) -> int:
    """Ask the child's group to stop, wait up to ``timeout`` seconds, then SIGKILL the group; the exit code."""
    signal_group(process, sig)
    return reap(process, timeout)


def reap(process: Child, timeout: float) -> int:
    """Wait for an already-signalled child; SIGKILL its group when it does not exit in time."""
    try:
        return process.wait(max(0.1, timeout))
    except subprocess.TimeoutExpired:
        signal_group(process, signal.SIGKILL)
        return process.wait()
