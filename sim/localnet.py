"""A whole network on one machine: an S3 engine, a LocalChain, funded wallets, miner and validator processes.

Used by ``scripts/localnet.py`` and the end-to-end tests.  Everything lives in
one run folder: ``chain.sqlite``, ``wallets/``, ``state/``, ``config.json``
(the run's hyper-parameters, pinned data hash) and ``logs/`` (each process's
output and its JSON lines).  Processes run in their own process groups and are
always stopped on exit — also on Ctrl-C or an error.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dso.chain.local import LocalChain
from dso.chain.wallets import create_local_wallet, hotkey_address
from dso.config import HParams
from dso.data import Dataset
from storage.engines import DEFAULT_ENGINE, Engine, start_engine

ROOT = Path(__file__).resolve().parents[1]
VALIDATOR_STAKES = (1000.0, 400.0, 200.0, 100.0)
MINER_NICE = 10  # on one shared machine the validator (one process, every peer's work) must not be starved


@dataclass
class NodeSpec:
    name: str                 # wallet name and log file stem
    role: str                 # miner | validator
    behaviour: str = "honest"
    stake: float = 0.0
    uid: int = -1
    process: subprocess.Popen | None = None
    extra_args: list[str] = field(default_factory=list)

    @property
    def program(self) -> list[str]:
        """Honest nodes run the production entry points; other behaviours the experiment's miner."""
        if self.role == "miner" and self.behaviour not in ("honest", "diligent"):
            return ["-m", "sim.miner", "--behaviour", self.behaviour]
        return [str(ROOT / "neurons" / f"{self.role}.py")]


def plan_nodes(miners: int, adversaries: list[tuple[str, int]], validators: int) -> list[NodeSpec]:
    nodes = [NodeSpec(f"validator{i}", "validator", stake=VALIDATOR_STAKES[min(i, len(VALIDATOR_STAKES) - 1)])
             for i in range(validators)]
    nodes += [NodeSpec(f"miner{i}", "miner") for i in range(miners)]
    for kind, count in adversaries:
        nodes += [NodeSpec(f"{kind}{i}", "miner", behaviour=kind) for i in range(count)]
    return nodes


class LocalNet:
    def __init__(self, run_dir: Path, hp: HParams, nodes: list[NodeSpec], *, block_time: float = 1.0,
                 corpus: str = "shakespeare", cache_dir: str = "~/.cache/dso", tempo: int = 10,
                 engine: str = DEFAULT_ENGINE, s3: Engine | None = None, tokenizer_file: str = ""):
        """``engine``: the S3 server the network starts (and stops at the end): moto or SeaweedFS.  ``s3``: an
        engine to run against instead, left running (e.g. a store an earlier run used, or an external one)."""
        self.run_dir, self.hp, self.nodes = Path(run_dir), hp, nodes
        self.block_time, self.corpus, self.cache_dir, self.tempo = block_time, corpus, cache_dir, tempo
        self.engine, self.s3, self.tokenizer_file = engine, s3, tokenizer_file
        self._own_s3 = s3 is None
        self.chain: LocalChain | None = None
        self._creds: dict = {}
        self.logs = self.run_dir / "logs"

    # ------------------------------------------------------------- set-up
    def prepare(self) -> None:
        """Data hash, S3 server, chain, wallets, registrations, stakes, bucket credentials, run config."""
        for stale in ("state", "logs", "wallets"):  # a new chain: nothing of an earlier run applies
            shutil.rmtree(self.run_dir / stale, ignore_errors=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir()
        # tokenise (and with BPE, train the tokeniser) once into the shared cache, then pin the run's data
        self.hp.data_hash = ""
        self.hp.data_hash = Dataset.for_run(self.hp, self.corpus, self.cache_dir, self.tokenizer_file).data_hash
        if self.s3 is None:
            self.s3 = start_engine(self.engine)
        chain_file = self.run_dir / "chain.sqlite"
        chain_file.unlink(missing_ok=True)
        self.chain = LocalChain.create(chain_file, block_time=self.block_time, tempo=self.tempo,
                                       commit_interval_blocks=0, immunity_blocks=10_000)
        wallets = self.run_dir / "wallets"
        for node in self.nodes:
            wallet = create_local_wallet(node.name, "default", str(wallets), overwrite=True)
            node.uid = self.chain.register(wallet)
            if node.stake:
                self.chain.add_stake(hotkey_address(wallet), node.stake)
        config = {"subtensor": {"network": "localchain", "localchain_path": str(chain_file)},
                  "storage": {"endpoint": self.s3.endpoint, "region": self.s3.region,
                              "allow_loopback_endpoints": True},  # a local run: every endpoint is loopback
                  "data": {"corpus": self.corpus, "cache_dir": self.cache_dir, "tokenizer_file": self.tokenizer_file},
                  "neuron": {"state_dir": str(self.run_dir / "state")},
                  "hparams": asdict(self.hp)}
        (self.run_dir / "config.json").write_text(json.dumps(config, indent=2))

    def credentials(self, node: NodeSpec):
        """The node's bucket keys, provisioned once (provisioning again would revoke the old keys)."""
        if node.name not in self._creds:
            self._creds[node.name] = self.s3.provision(node.name.replace("_", "-"))
        return self._creds[node.name]

    def env_for(self, node: NodeSpec) -> dict[str, str]:
        creds = self.credentials(node)
        env = dict(os.environ)
        env.update({"AWS_ACCESS_KEY_ID": creds.write_key_id, "AWS_SECRET_ACCESS_KEY": creds.write_secret,
                    "DSO_READ_ACCESS_KEY_ID": creds.read_key_id, "DSO_READ_SECRET_ACCESS_KEY": creds.read_secret,
                    "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
        env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env

    def command(self, node: NodeSpec) -> list[str]:
        cmd = [sys.executable, *node.program, "--config", str(self.run_dir / "config.json"),
               "--wallet.name", node.name, "--wallet.path", str(self.run_dir / "wallets"),
               "--neuron.log_json", str(self.logs / f"{node.name}.jsonl")]
        if node.behaviour == "diligent":  # an honest miner with twice the compute: more of its assignment
            cmd += ["--neuron.train_sequences", str(min(2 * self.hp.batch_size, self.hp.assigned_sequences))]
        return cmd + node.extra_args

    def start(self) -> None:
        for node in sorted(self.nodes, key=lambda n: n.role != "validator"):  # validators first
            self.start_node(node)

    def start_node(self, node: NodeSpec) -> None:
        env = self.env_for(node)
        cmd = self.command(node) + ["--storage.bucket", self.credentials(node).bucket]
        nice = MINER_NICE if node.role == "miner" else 0
        with open(self.logs / f"{node.name}.log", "ab") as out:
            node.process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=env, cwd=ROOT, start_new_session=True,
                                            preexec_fn=(lambda: os.nice(nice)) if nice else None)

    # ------------------------------------------------------------ running
    def validator_lines(self, name: str = "validator0") -> list[dict]:
        return read_jsonl(self.logs / f"{name}.jsonl")

    def miner_lines(self) -> dict[str, list[dict]]:
        return {n.name: read_jsonl(self.logs / f"{n.name}.jsonl") for n in self.nodes if n.role == "miner"}

    def dead(self) -> list[NodeSpec]:
        return [n for n in self.nodes if n.process is not None and n.process.poll() is not None]

    @staticmethod
    def _signal(node: NodeSpec, sig: int) -> None:
        if node.process is not None and node.process.poll() is None:
            try:
                os.killpg(node.process.pid, sig)
            except ProcessLookupError:
                pass

    @staticmethod
    def _reap(node: NodeSpec, timeout: float) -> None:
        """Wait for a signalled node; SIGKILL its process group when it does not stop in time."""
        if node.process is None:
            return
        try:
            node.process.wait(max(0.1, timeout))
        except subprocess.TimeoutExpired:
            LocalNet._signal(node, signal.SIGKILL)
            node.process.wait()

    def stop_node(self, node: NodeSpec, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        self._signal(node, sig)
        self._reap(node, timeout)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM every node once (they finish their step and save), then wait; SIGKILL stragglers."""
        for node in self.nodes:
            self._signal(node, signal.SIGTERM)
        deadline = time.time() + timeout
        for node in self.nodes:
            self._reap(node, deadline - time.time())
        if self.s3 is not None and self._own_s3:
            self.s3.stop()
            self.s3 = None

    def __enter__(self) -> "LocalNet":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def read_jsonl(path: Path) -> list[dict]:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line being written right now
    return out


def wait_for(predicate, timeout: float, step: float = 0.5, on_tick=None) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        if on_tick:
            on_tick()
        time.sleep(step)
    return predicate()
