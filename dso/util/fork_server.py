"""A pre-imported interpreter that forks Python programs, so a node starts in a fraction of a second.

A node imports torch, boto3 and the chain SDK before its first line: 3–4 CPU seconds each, and 12–16 s of wall
time when a local network's nodes start together on two cores.  :class:`ForkServer` starts one interpreter that
imports those modules once (``preload``) and forks a child per program; the child runs the program as
``python PROGRAM ARGS`` would (``__main__``, ``sys.argv``, its own environment, working directory and log file)
and keeps what :func:`dso.util.processes.spawn` promises: its own session and process group, a niceness, and
SIGTERM from the kernel when its parent (the server) dies — and the server dies with whoever started it.

The server forks only while it runs a single thread (it never runs torch code), so no lock is held in a child.
Linux only (``fork`` after importing torch is not safe on macOS): :func:`available` says whether it can be used.
"""
from __future__ import annotations

import atexit
import gc
import importlib
import importlib.util
import json
import os
import runpy
import selectors
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import IO, Any

from dso.util.processes import autogroup_nice, die_with_parent, spawn, stop

ENCODING = "utf-8"


def available() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "fork")


class ForkedProcess:
    """A child of the fork server, seen as much like ``subprocess.Popen`` as :mod:`dso.util.processes` needs:
    ``pid``, ``returncode``, ``poll()`` and ``wait(timeout)``.  The server reaps it and reports its exit code."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid, self.args = pid, args
        self.returncode: int | None = None
        self._exited = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def _exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()


class ForkServer:
    """One pre-imported interpreter; :meth:`spawn` forks a program from it.  Use as a context manager, or
    :meth:`close` it once its children are stopped (closing it sends them SIGTERM)."""

    def __init__(self, preload: list[str], *, env: dict[str, str] | None = None, cwd: str | Path | None = None,
                 start_seconds: float = 120.0) -> None:
        self._server = spawn([sys.executable, "-m", "dso.util.fork_server", *preload], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=env, cwd=cwd)
        assert self._server.stdin is not None and self._server.stdout is not None
        self._requests: IO[bytes] = self._server.stdin
        self._lock = threading.Lock()
        self._children: dict[int, ForkedProcess] = {}
        self._started: dict[int, threading.Event] = {}
        self._answers: dict[int, dict[str, Any]] = {}
        self._argv: dict[int, list[str]] = {}
        self._next_id = 0
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, args=(self._server.stdout,), daemon=True,
                                        name="fork-server")
        self._reader.start()
        if not self._ready.wait(start_seconds) or self._server.poll() is not None:
            self.close()
            raise RuntimeError(f"the fork server did not start (preloading {', '.join(preload)})")

    def spawn(self, argv: list[str], *, log: Path, env: dict[str, str], cwd: str | Path, nice: int = 0,
              timeout: float = 30.0) -> ForkedProcess:
        """Fork ``python *argv`` (``argv`` is what follows the interpreter: a script and its arguments, or
        ``-m module …``) with stdout and stderr appended to ``log``."""
        with self._lock:
            self._next_id += 1
            ident = self._next_id
            self._started[ident] = done = threading.Event()
            self._argv[ident] = argv
            request = {"id": ident, "argv": argv, "log": str(log), "env": env, "cwd": str(cwd), "nice": nice}
            self._requests.write(json.dumps(request).encode(ENCODING) + b"\n")
            self._requests.flush()
        if not done.wait(timeout):
            raise RuntimeError(f"the fork server did not start {argv[:2]} within {timeout:.0f} s")
        answer = self._answers.pop(ident)
        if "error" in answer:
            raise RuntimeError(f"the fork server could not start {argv[:2]}: {answer['error']}")
        return self._children[int(answer["pid"])]

    def _read(self, answers: IO[bytes]) -> None:
        for raw in answers:
            message = json.loads(raw)
            if "ready" in message:
                self._ready.set()
            elif "exited" in message:
                child = self._children.get(int(message["exited"]))
                if child is not None:
                    child._exit(int(message["code"]))
            else:
                ident = int(message["id"])
                if "pid" in message:
                    self._children[int(message["pid"])] = ForkedProcess(int(message["pid"]), self._argv.pop(ident))
                self._answers[ident] = message
                self._started.pop(ident).set()
        for child in self._children.values():  # the server is gone, and with it every child it had
            if child.returncode is None:
                child._exit(-int(signal.SIGTERM))

    def close(self, timeout: float = 10.0) -> None:
        try:
            self._requests.close()
        except OSError:
            pass
        stop(self._server, timeout)

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------ the server process
_ANSWERS: IO[bytes] | None = None  # the pipe to the ForkServer (the server's own stdout goes to its stderr)


def _answer(message: dict[str, Any]) -> None:
    assert _ANSWERS is not None
    _ANSWERS.write(json.dumps(message).encode(ENCODING) + b"\n")
    _ANSWERS.flush()


def _reap() -> None:
    """Report every child that has exited."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _answer({"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def serve(preload: list[str]) -> None:
    """Import ``preload``, then fork one child per request line on stdin until stdin closes."""
    global _ANSWERS
    _ANSWERS = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever an import prints cannot reach the answers
    for name in preload:
        importlib.import_module(name)
    gc.freeze()  # the imported objects stay in pages the children share instead of copying them on collection
    server = os.getpid()
    requests = selectors.DefaultSelector()
    requests.register(sys.stdin.buffer, selectors.EVENT_READ)
    _answer({"ready": True})
    while True:
        if requests.select(timeout=0.2):
            line = sys.stdin.buffer.readline()
            if not line:
                break
            request = json.loads(line)
            _answer(_fork(request, server, requests))
        _reap()


def _fork(request: dict[str, Any], server: int, requests: Any) -> dict[str, Any]:
    """Fork the child ``request`` names; the answer once it leads its own session (so a signal to its group
    reaches it from the first moment its pid is known)."""
    ready, led = os.pipe()
    try:
        pid = os.fork()
    except OSError as e:
        os.close(ready)
        os.close(led)
        return {"id": request["id"], "error": str(e)}
    if pid == 0:
        os.close(ready)
        requests.close()
        assert _ANSWERS is not None
        _ANSWERS.close()
        _run_child(request, server, led)
    os.close(led)
    os.read(ready, 1)  # empty if the child died first: its exit is reported all the same
    os.close(ready)
    return {"id": request["id"], "pid": pid}


def _run_child(request: dict[str, Any], server: int, led: int) -> None:
    """In the forked child: become the program ``request`` names, then exit with its code (never returns)."""
    code = 1
    try:
        _become(request, server, led)
        code = _run_program(list(request["argv"]))
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _become(request: dict[str, Any], server: int, led: int) -> None:
    """What ``spawn`` gives a child (session, niceness, death signal), then the program's own process state."""
    os.setsid()
    os.write(led, b"1")
    os.close(led)
    if request["nice"]:
        os.nice(int(request["nice"]))
        autogroup_nice(int(request["nice"]))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    die_with_parent(server)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    # unbuffered, as PYTHONUNBUFFERED gives a fresh interpreter: a killed node's log keeps its last line
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - lives as long as the process
    sys.stdout = open(1, "w", buffering=1, closefd=False, encoding=ENCODING, errors="backslashreplace")  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False, encoding=ENCODING, errors="backslashreplace")  # noqa: SIM115
    sys.stdout.reconfigure(write_through=True)
    sys.stderr.reconfigure(write_through=True)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if "numpy" in sys.modules:  # a fresh interpreter seeds numpy's global generator from the OS; so does a fork
        sys.modules["numpy"].random.seed()


def _run_program(argv: list[str]) -> int:
    """Run ``python *argv`` in this process; its exit code."""
    try:
        if argv[0] == "-m":  # the module's file as __main__ (its preloaded copy stays as it is)
            spec = importlib.util.find_spec(argv[1])
            if spec is None or spec.origin is None:
                raise SystemExit(f"No module named {argv[1]}")
            argv = [spec.origin, *argv[2:]]
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException:  # noqa: BLE001 - what the interpreter would print before exiting with 1
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # what the interpreter runs at exit (logging's flush among them)
    return code


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    serve(sys.argv[1:])
