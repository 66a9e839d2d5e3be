"""The local network as an operator runs it: `make run > out.txt` — output that is not a
terminal — leaves one readable line per window; every node's metrics endpoint answers while it runs;
SIGTERM stops the whole network within seconds, every node saving its state, and leaves no process
behind; SIGKILL of the local network's own process leaves no orphan either (parent-death signal)."""
from __future__ import annotations

import dataclasses
import json
import math
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from scrape import one, scrape

from dso.config.schema import HParams
from dso.util.processes import has_parent_death_signal
from sim.localnet import ROOT

WINDOW_LINE = re.compile(r"^window (\d+)  val loss (\d+\.\d{4}) nats/token \((\d+\.\d{3}) bits/byte\)  "
                         r"weights: .+  rejected: .+  \[(\d+)/\d+, \d+ s\]$")


def set_flags(hp: HParams) -> list[str]:
    """`--set hparams.KEY=VALUE` for every setting that differs from the defaults."""
    def leaves(d: dict, prefix: str = "hparams."):
        for k, v in d.items():
            yield from leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else [(prefix + k, v)]
    default = dict(leaves(dataclasses.asdict(HParams())))
    return [f"--set={k}={str(v).lower() if isinstance(v, bool) else v}"
            for k, v in leaves(dataclasses.asdict(hp)) if default[k] != v]


def start_localnet(root: Path, corpus: Path, hp: HParams, miners: int) -> tuple[subprocess.Popen, Path]:
    """`python scripts/localnet.py … > out.txt`: stdout is a file, not a terminal."""
    out = root / "out.txt"
    with open(out, "wb") as f:
        process = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "localnet.py"), "--windows", "100",
                                    "--miners", str(miners), "--no-adversaries", "--block-time", "0.5",
                                    "--data.corpus", str(corpus), "--data.cache_dir", str(root / "cache"),
                                    "--report-dir", str(root / "report"), *set_flags(hp)],
                                   stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT)
    return process, out


def wait_until(predicate, timeout: float, process: subprocess.Popen, out: Path) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert process.poll() is None, f"localnet exited early:\n{out.read_text()[-3000:]}"
        assert time.time() < deadline, f"timed out:\n{out.read_text()[-3000:]}"
        time.sleep(0.5)


def window_lines(out: Path) -> list[str]:
    return [line for line in out.read_text().splitlines() if line.startswith("window ")]


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (its nodes run in their own sessions but are still its children)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def running(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            alive.add(pid)
    return alive


def wait_gone(pids: set[int], timeout: float) -> set[int]:
    deadline = time.time() + timeout
    while running(pids) and time.time() < deadline:
        time.sleep(0.2)
    return running(pids)


def metrics_ports(run_dir: Path) -> dict[str, int]:
    """node name → port, from the Prometheus scrape config the local network wrote."""
    text = (run_dir / "prometheus.yml").read_text()
    return {name: int(port) for port, name in re.findall(r'"127\.0\.0\.1:(\d+)"\]\n\s+labels: \{node: "([^"]+)"',
                                                          text)}


def test_make_run_into_a_file_then_sigterm(tmp_path, stdlib_corpus, network_hparams):
    process, out = start_localnet(tmp_path, stdlib_corpus, network_hparams(), miners=2)
    try:
        wait_until(lambda: len(window_lines(out)) >= 2, 240, process, out)
        # curl on a running miner's and validator's metrics port returns the metrics
        ports = metrics_ports(tmp_path / "report" / "run")
        assert set(ports) == {"validator0", "miner0", "miner1"}
        # a miner's counter moves when it records a window: on a loaded machine that can come after the validator's
        # second line (its first window may be a catch-up), so wait for both miners' (the report's utilisation
        # holds a miner once it recorded a window), boundedly
        for miner in ("miner0", "miner1"):
            wait_until(lambda miner=miner: one(scrape(ports[miner]), "dso_trained_tokens_total") > 0, 120, process, out)
        assert one(scrape(ports["validator0"]), "dso_validation_loss_bits_per_byte") > 0
        tree = descendants(process.pid)
        assert len(running(tree)) >= 4, tree              # S3 server, validator, two miners
        signalled = time.time()
        process.send_signal(signal.SIGTERM)
        left = wait_gone(tree, 25.0)   # grace 5 s + the interpreter's exit; the local network kills at 10 s
        stopped_in = time.time() - signalled
        code = process.wait(120)                          # then it writes the report
    finally:
        process.kill()
    assert not left, f"processes left after SIGTERM: {left}"
    assert stopped_in < 25 and code == 0, out.read_text()[-3000:]
    text = out.read_text()
    lines = window_lines(out)
    assert len(lines) >= 2 and all(WINDOW_LINE.match(line) for line in lines), lines
    assert [int(WINDOW_LINE.match(line)[4]) for line in lines] == list(range(1, len(lines) + 1))
    # bits per byte next to nats per token: b = n / ln 2 × (tokens per byte of the validation text), one factor for
    # the whole run, below 1 / ln 2 (a BPE token holds at least one byte)
    pairs = [(float(WINDOW_LINE.match(line)[2]), float(WINDOW_LINE.match(line)[3])) for line in lines]
    factor = pairs[0][1] / pairs[0][0]
    assert 0 < factor <= 1 / math.log(2) + 1e-3, pairs
    assert all(b == pytest.approx(n * factor, abs=3e-3) for n, b in pairs), pairs
    assert "\x1b[" not in text                            # no terminal escapes in a file
    for step in ("data: ", "S3 at ", "wallets: 3/3 registered", "nodes: 3/3 started", "all processes stopped in"):
        assert step in text, step
    assert (tmp_path / "report" / "report.html").stat().st_size > 0
    logs = tmp_path / "report" / "run" / "logs"           # every node stopped on its own, state saved
    assert "stopped at window" in (logs / "validator0.log").read_text()
    for name in ("miner0", "miner1"):
        assert "dso.miner INFO stopped" in (logs / f"{name}.log").read_text(), name
    state = tmp_path / "report" / "run" / "state"
    assert (state / "validator0-default" / "validator" / "current").exists()
    assert (state / "miner0-default" / "miner" / "error_feedback.safetensors").exists()
    # the report's training figures, and text from the validator's final model
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert 0 < report["unigram_bits_per_byte"] < 8 and report["final_val_bits_per_byte"] > 0
    assert report["tokens"] > 0 and len(report["miner_utilisation"]) == 2      # the two honest miners
    assert all(0 < u <= 1.5 for u in report["miner_utilisation"].values())
    assert len(report["samples"]) == 2 and all(s["text"] for s in report["samples"])
    # the corpus went to a dataset bucket on the network's own S3 server, and every node read it from there
    source = report["data_source"]
    assert source.startswith("s3://dso-dataset/") and f"data: published to {source}" in text
    for name in ("validator0", "miner0", "miner1"):
        assert f" from {source}, hparams " in (logs / f"{name}.log").read_text(), name
    sampled = subprocess.run([sys.executable, str(ROOT / "scripts" / "sample.py"), str(state), "--prompt", "The ",
                              "--tokens", "12", "--seed", "1"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert sampled.returncode == 0 and "--- prompt 'The '" in sampled.stdout, sampled.stderr[-2000:]


@pytest.mark.skipif(not has_parent_death_signal(), reason="the parent-death signal (prctl) is Linux only")
def test_sigkill_of_the_local_network_leaves_no_orphan(tmp_path, stdlib_corpus, network_hparams):
    process, out = start_localnet(tmp_path, stdlib_corpus, network_hparams(), miners=1)
    try:
        logs = tmp_path / "report" / "run" / "logs"
        up = lambda: all(" hotkey " in (logs / f"{n}.log").read_text()  # noqa: E731
                         for n in ("validator0", "miner0") if (logs / f"{n}.log").exists()) and \
            "nodes: 2/2 started" in out.read_text()
        wait_until(up, 240, process, out)
        tree = descendants(process.pid)
        assert len(running(tree)) >= 3, tree              # S3 server, validator, miner
        process.kill()                                    # SIGKILL: it cleans up nothing itself
        process.wait()
        left = wait_gone(tree, 30.0)  # a node ends its step and saves before it exits
    finally:
        process.kill()
    assert not left, f"orphans after SIGKILL: {left}"
