"""A program forked from the pre-imported interpreter (dso/util/fork_server.py) runs as ``python PROGRAM`` would
and is stopped like any other child (dso/util/processes.py)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_processes import alive, wait_gone

from dso.util import fork_server, processes
from repo import ROOT

pytestmark = pytest.mark.skipif(not fork_server.available(), reason="the fork server needs Linux's fork")

PROGRAM = textwrap.dedent("""
    import json, os, sys
    print(json.dumps({"argv": sys.argv, "name": __name__, "cwd": os.getcwd(), "flag": os.environ.get("FLAG"),
                      "nice": os.nice(0), "group": os.getpgid(0) == os.getpid(), "torch": "torch" in sys.modules}))
    sys.exit(int(sys.argv[1]))
""")


@pytest.fixture(scope="module")
def server():
    with fork_server.ForkServer(["json", "torch"], env=dict(os.environ), cwd=ROOT) as forks:
        yield forks


def run(server: fork_server.ForkServer, tmp_path: Path, argv: list[str], **kw) -> tuple[int, str]:
    log = tmp_path / "out.log"
    child = server.spawn(argv, log=log, env={**os.environ, "FLAG": "set"}, cwd=tmp_path, **kw)
    return child.wait(30), log.read_text()


def test_a_program_gets_its_arguments_environment_directory_and_exit_code(server, tmp_path):
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    code, out = run(server, tmp_path, [str(program), "3", "x"], nice=4)
    assert code == 3
    seen = json.loads(out.splitlines()[0])
    assert seen["argv"] == [str(program), "3", "x"] and seen["name"] == "__main__"
    assert seen["cwd"] == str(tmp_path) and seen["flag"] == "set"
    assert seen["nice"] == os.nice(0) + 4 and seen["group"] and seen["torch"]  # niced, own group, preloaded


def test_a_module_runs_as_main_and_a_crash_is_exit_code_1_with_its_traceback(server, tmp_path):
    code, out = run(server, tmp_path, ["-m", "json.tool", "--help"])
    assert code == 0 and "usage:" in out
    crash = tmp_path / "crash.py"
    crash.write_text("raise ValueError('boom')\n")
    code, out = run(server, tmp_path, [str(crash)])
    assert code == 1 and "ValueError: boom" in out and "Traceback" in out


def test_a_signal_to_the_childs_group_stops_it_at_once(server, tmp_path):
    sleeper = tmp_path / "sleep.py"
    sleeper.write_text("import time\ntime.sleep(120)\n")
    child = server.spawn([str(sleeper)], log=tmp_path / "log", env=dict(os.environ), cwd=tmp_path)
    assert processes.stop(child, timeout=10) == -signal.SIGTERM
    assert child.poll() == -signal.SIGTERM and not alive(child.pid)


def test_children_die_with_the_server_and_the_server_with_its_parent(tmp_path):
    """SIGKILL the process that started the server: the kernel stops the server, and the server's children."""
    sleeper = tmp_path / "sleep.py"
    sleeper.write_text("import time\ntime.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        from dso.util.fork_server import ForkServer
        forks = ForkServer([], env=dict(os.environ), cwd={str(tmp_path)!r})
        child = forks.spawn([{str(sleeper)!r}], log=Path({str(tmp_path / "log")!r}), env=dict(os.environ),
                            cwd={str(tmp_path)!r})
        print(forks._server.pid, child.pid, flush=True)
        time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert parent.stdout is not None
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2 and all(alive(p) for p in pids)
    parent.kill()
    parent.wait()
    assert wait_gone(pids, timeout=10) == []
