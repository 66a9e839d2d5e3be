"""A whole network on one machine: an S3 engine, a LocalChain, funded wallets, miner and validator processes.

Used by ``scripts/localnet.py`` and the end-to-end tests.  Everything lives in
one run folder: ``chain.sqlite``, ``wallets/``, ``state/``, ``config.json``
(the run's hyper-parameters, pinned data hash, the local corpus) and ``logs/``
(each process's output and its JSON lines) and ``prometheus.yml`` (a scrape
config for every node's metrics endpoint, docs/operations.md).

The corpus is published, as an operator would, to a dataset bucket on the
network's own S3 server (``s3://dso-dataset/<data hash>``, docs/data.md), and
every node reads it from there: ``--data.corpus`` and ``--data.endpoint`` on
its command line, the bucket's read key in its environment.  ``config.json``
keeps the local corpus it was made from (the same data hash), so tools that
read the run folder after the S3 server is gone still find the tokeniser.  Processes run in their own
process groups, are always stopped on exit — also on Ctrl-C, SIGTERM or an
error — and die with this process even when it is SIGKILLed (dso/util/processes.py).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dso.chain.local import LocalChain
from dso.chain.wallets import create_local_wallet, hotkey_address
from dso.config.schema import HParams
from dso.data.dataset import Dataset, run_shards
from dso.data.shards import ShardSet
from dso.util import fork_server
from dso.util.processes import Child, reap, signal_group, spawn
from sim import behaviours
from storage.credentials import PeerCredentials
from storage.dataset import DATA_KEY_ENV, DATA_SECRET_ENV
from storage.dataset_upload import publish
from storage.engines import DEFAULT_ENGINE, Engine, start_engine

ROOT = Path(__file__).resolve().parents[1]
VALIDATOR_STAKES = (1000.0, 400.0, 200.0, 100.0)
# On one shared machine the validator (one process, every peer's work: 5-7 s of CPU per window) must not be
# starved by miners that train all the time: nice 6 weighs about a quarter of nice 0, and at 3 / 0 the validator
# overran every other window.  Not more: a node's nice also ranks it against everything else on the machine
# (every node has its own autogroup, dso/util/processes.py), and a network niced far down stalls on a loaded machine.
# The diligent miner is an honest miner with more compute: every miner trains its whole window, so on one
# machine "more compute" is a larger CPU share, twice a baseline miner's (docs/training.md).
MINER_NICE = 6
DILIGENT_NICE = 3
STOP_SECONDS = 10.0  # a node stops within its grace time (neurons/lifecycle.py); then it is killed
DATASET = "dataset"  # the dataset bucket's name on the network's S3 server: dso-dataset
Progress = Callable[[str], None]


def _quiet(step: str) -> None:
    pass


@dataclass
class NodeSpec:
    name: str                 # wallet name and log file stem
    role: str                 # miner | validator
    behaviour: str = "honest"
    stake: float = 0.0
    uid: int = -1
    process: Child | None = None
    extra_args: list[str] = field(default_factory=list)
    metrics_port: int = 0     # 0: no metrics endpoint
    ranks: int = 1            # > 1: the node runs as a torchrun group of this many ranks (docs/scale.md)

    @property
    def plan(self) -> behaviours.Plan | None:
        """What a miner's behaviour does in a window, as far as the network's setup must know (None: not a
        miner's behaviour)."""
        known = behaviours.REGISTRY.get(self.behaviour) if self.role == "miner" else None
        return None if known is None else known().plan(0)

    @property
    def program(self) -> list[str]:
        """Honest nodes run the production entry points (through torchrun on several ranks); other behaviours
        the experiment's miner or validator."""
        if self.behaviour not in behaviours.GOOD:  # sim.miner and sim.validator refuse a name they do not know
            return ["-m", f"sim.{self.role}", "--behaviour", self.behaviour]
        entry = str(ROOT / "neurons" / f"{self.role}.py")
        if self.ranks > 1:
            return ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={self.ranks}", entry]
        return [entry]


def plan_nodes(miners: int, adversaries: list[tuple[str, int]], validators: int,
               miner_ranks: int = 1) -> list[NodeSpec]:
    """Validators, honest miners (the first of them on ``miner_ranks`` ranks) and adversaries."""
    nodes = [NodeSpec(f"validator{i}", "validator", stake=VALIDATOR_STAKES[min(i, len(VALIDATOR_STAKES) - 1)])
             for i in range(validators)]
    nodes += [NodeSpec(f"miner{i}", "miner", ranks=miner_ranks if i == 0 else 1) for i in range(miners)]
    for kind, count in adversaries:
        nodes += [NodeSpec(f"{kind}{i}", "miner", behaviour=kind) for i in range(count)]
    return nodes


class LocalNet:
    def __init__(self, run_dir: Path, hp: HParams, nodes: list[NodeSpec], *, block_time: float = 1.0,
                 corpus: str = "shakespeare", cache_dir: str = "~/.cache/dso", tempo: int = 10,
                 engine: str = DEFAULT_ENGINE, s3: Engine | None = None, tokenizer_file: str = "",
                 metrics: bool = True, data_bucket: bool = True, fork: bool = True):
        """``fork``: start the single-process nodes from one pre-imported interpreter (dso/util/fork_server.py:
        a node starts in a fraction of a second instead of importing torch afresh) where the platform allows.
        ``engine``: the S3 server the network starts (and stops at the end): moto or SeaweedFS.  ``s3``: an
        engine to run against instead, left running (e.g. a store an earlier run used, or an external one).
        ``data_bucket``: publish the corpus to a dataset bucket and have every node read it from there (else
        every node reads the local shards)."""
        self.run_dir, self.hp, self.nodes = Path(run_dir), hp, nodes
        self.block_time, self.corpus, self.cache_dir, self.tempo = block_time, corpus, cache_dir, tempo
        self.engine, self.s3, self.tokenizer_file = engine, s3, tokenizer_file
        self._own_s3 = s3 is None
        self.metrics, self.data_bucket = metrics, data_bucket
        self.fork = fork and fork_server.available()
        self._forks: fork_server.ForkServer | None = None
        self.data_source = ""            # where the nodes read the corpus: an s3:// URL, or the local shards
        self._data_keys: tuple[str, str] | None = None
        self.chain: LocalChain | None = None
        self._creds: dict[str, PeerCredentials] = {}
        self.logs = self.run_dir / "logs"

    # ------------------------------------------------------------- set-up
    def prepare(self, progress: Progress = _quiet) -> None:
        """Data hash, S3 server, chain, wallets, registrations, stakes, bucket credentials, run config;
        ``progress`` hears one short line per step."""
        for stale in ("state", "logs", "wallets"):  # a new chain: nothing of an earlier run applies
            shutil.rmtree(self.run_dir / stale, ignore_errors=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir()
        # tokenise (and with BPE, train the tokeniser) once into the shared cache, then pin the run's data
        progress(f"data: tokenising and hashing {self.corpus} (cached after the first run)")
        self.hp.data_hash = ""
        shards = run_shards(self.hp, self.corpus, self.cache_dir, self.tokenizer_file)
        self.hp.data_hash = Dataset.from_shard_set(self.hp, shards, self.tokenizer_file, self.corpus).data_hash
        progress(f"data: {self.hp.data_hash[:10]}…; starting the S3 server")
        if self.s3 is None:
            self.s3 = start_engine(self.engine)
        self.data_source = self.publish_data(shards, progress) if self.data_bucket else shards.origin
        progress(f"S3 at {self.s3.endpoint}; creating the chain and {len(self.nodes)} wallets")
        chain_file = self.run_dir / "chain.sqlite"
        chain_file.unlink(missing_ok=True)
        self.chain = LocalChain.create(chain_file, block_time=self.block_time, tempo=self.tempo,
                                       commit_interval_blocks=0, immunity_blocks=10_000)
        wallets = self.run_dir / "wallets"
        for i, node in enumerate(self.nodes, 1):
            wallet = create_local_wallet(node.name, "default", str(wallets), overwrite=True)
            self.chain.fund(hotkey_address(wallet), self.chain.registration_burn())  # what registering burns now
            node.uid = self.chain.register(wallet)
            if node.stake:
                self.chain.add_stake(hotkey_address(wallet), node.stake)
            progress(f"wallets: {i}/{len(self.nodes)} registered ({node.name}, uid {node.uid})")
        if self.metrics:
            taken: set[int] = set()
            for node in self.nodes:
                node.metrics_port = free_port(taken)
            (self.run_dir / "prometheus.yml").write_text(prometheus_config(self.nodes))
        config = {"subtensor": {"network": "localchain", "localchain_path": str(chain_file)},
                  "storage": {"endpoint": self.s3.endpoint, "region": self.s3.region,
                              "allow_loopback_endpoints": True},  # a local run: every endpoint is loopback
                  "data": {"corpus": self.corpus, "cache_dir": self.cache_dir, "tokenizer_file": self.tokenizer_file},
                  "neuron": {"state_dir": str(self.run_dir / "state")},
                  "hparams": asdict(self.hp)}
        (self.run_dir / "config.json").write_text(json.dumps(config, indent=2))

    def publish_data(self, shards: ShardSet, progress: Progress = _quiet) -> str:
        """Publish the corpus to the dataset bucket (``prepare_data.py --upload``'s code) and keep its read key
        for the nodes; the URL.  An external store without a ``dataset.json`` key file: the local shards."""
        assert self.s3 is not None
        try:
            creds = self.s3.provision(DATASET)
        except ValueError as e:  # ExternalEngine: the operator made no dataset bucket keys
            progress(f"data: no dataset bucket ({e}); every node reads the local shards")
            return shards.origin
        url = f"s3://{creds.bucket}/{self.hp.data_hash}"  # (its first 16 digits name only the tokeniser)
        done = publish(shards.folder, url, creds.write_client())
        self._data_keys = (creds.read_key_id, creds.read_secret)
        progress(f"data: published to {url} ({done.objects} objects, {done.nbytes / 1e6:.1f} MB); every node "
                 "reads it from there")
        return url

    def credentials(self, node: NodeSpec) -> PeerCredentials:
        """The node's bucket keys, provisioned once (provisioning again would revoke the old keys)."""
        assert self.s3 is not None, "prepare() starts the S3 server first"
        if node.name not in self._creds:
            self._creds[node.name] = self.s3.provision(node.name.replace("_", "-"))
        return self._creds[node.name]

    def env_for(self, node: NodeSpec) -> dict[str, str]:
        creds = self.credentials(node)
        env = node_environment()
        env.update({"AWS_ACCESS_KEY_ID": creds.write_key_id, "AWS_SECRET_ACCESS_KEY": creds.write_secret,
                    "DSO_READ_ACCESS_KEY_ID": creds.read_key_id, "DSO_READ_SECRET_ACCESS_KEY": creds.read_secret})
        if self._data_keys is not None:
            env[DATA_KEY_ENV], env[DATA_SECRET_ENV] = self._data_keys
        return env

    def command(self, node: NodeSpec) -> list[str]:
        cmd = [sys.executable, *node.program, "--config", str(self.run_dir / "config.json"),
               "--wallet.name", node.name, "--wallet.path", str(self.run_dir / "wallets"),
               "--neuron.log_json", str(self.logs / f"{node.name}.jsonl")]
        plan = node.plan
        if plan is not None and plan.data_batches > 1:
            # the diligent miner has about twice a miner's CPU (node_nice) and spends it as an operator should:
            # paper mode, two batches to the baseline's one; inner steps, steps of twice the sequences (more steps
            # of the same size score lower under the normalised evaluation step: docs/training.md, "Fifth pass")
            more = str(min(plan.data_batches * self.hp.batch_size, self.hp.assigned_sequences))
            cmd += ["--neuron.train_sequences" if self.hp.inner.mode == "gradient" else "--neuron.step_sequences",
                    more]
        if plan is not None and plan.late and self.hp.inner.mode == "steps":
            # its upload is judged late whatever it holds: one valid batch is enough to show that, and leaves the
            # CPU of the one machine to the miners and the validator whose timing the run measures
            cmd += ["--neuron.train_sequences", str(self.hp.batch_size)]
        if node.metrics_port:
            cmd += ["--neuron.metrics_port", str(node.metrics_port)]
        if self.data_source.startswith("s3://") and self.s3 is not None:
            cmd += ["--data.corpus", self.data_source, "--data.endpoint", self.s3.endpoint]
        return cmd + node.extra_args

    def start(self, progress: Progress = _quiet) -> None:
        ordered = sorted(self.nodes, key=lambda n: n.role != "validator")  # validators first
        for i, node in enumerate(ordered, 1):
            self.start_node(node)
            progress(f"nodes: {i}/{len(ordered)} started ({node.name})")

    def start_node(self, node: NodeSpec) -> None:
        """Start one node: its own process group, niced if a miner, and SIGTERMed by the kernel if we die."""
        env = self.env_for(node)
        cmd = self.command(node) + ["--storage.bucket", self.credentials(node).bucket]
        log = self.logs / f"{node.name}.log"
        if self.fork and node.ranks == 1:  # torchrun starts its ranks' interpreters itself
            node.process = self._fork_server().spawn(cmd[1:], log=log, env=env, cwd=ROOT, nice=node_nice(node))
            return
        with open(log, "ab") as out:
            node.process = spawn(cmd, nice=node_nice(node), stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=ROOT)

    def _fork_server(self) -> fork_server.ForkServer:
        """The interpreter the nodes are forked from, with every node program's modules imported."""
        if self._forks is None:
            programs = {n.program[1] if n.program[0] == "-m" else f"neurons.{n.role}" for n in self.nodes}
            self._forks = fork_server.ForkServer(sorted(programs), env=node_environment(), cwd=ROOT)
        return self._forks

    # ------------------------------------------------------------ running
    def validator_lines(self, name: str = "validator0") -> list[dict[str, Any]]:
        return read_jsonl(self.logs / f"{name}.jsonl")

    def miner_lines(self) -> dict[str, list[dict[str, Any]]]:
        return {n.name: read_jsonl(self.logs / f"{n.name}.jsonl") for n in self.nodes if n.role == "miner"}

    def dead(self) -> list[NodeSpec]:
        return [n for n in self.nodes if n.process is not None and n.process.poll() is not None]

    def stop_node(self, node: NodeSpec, sig: int = signal.SIGTERM, timeout: float = STOP_SECONDS) -> None:
        if node.process is not None:
            signal_group(node.process, sig)
            reap(node.process, timeout)

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        """SIGTERM every node once (they finish their step and save), then wait; SIGKILL stragglers."""
        for node in self.nodes:
            if node.process is not None:
                signal_group(node.process, signal.SIGTERM)
        deadline = time.time() + timeout
        for node in self.nodes:
            if node.process is not None:
                reap(node.process, deadline - time.time())
        if self._forks is not None:
            self._forks.close()
            self._forks = None
        if self.s3 is not None and self._own_s3:
            self.s3.stop()
            self.s3 = None

    def __enter__(self) -> LocalNet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def node_environment() -> dict[str, str]:
    """This process's environment as every node gets it: one thread, unbuffered output, the repository
    importable."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def node_nice(node: NodeSpec) -> int:
    """Scheduling niceness of a node's process: validators 0, miners MINER_NICE, the diligent miner less."""
    if node.role != "miner":
        return 0
    plan = node.plan
    return DILIGENT_NICE if plan is not None and plan.data_batches > 1 else MINER_NICE


def free_port(taken: set[int], host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (and not handed out before in this run)."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port: int = s.getsockname()[1]
        if port not in taken:
            taken.add(port)
            return port


def prometheus_config(nodes: list[NodeSpec], host: str = "127.0.0.1", interval: str = "5s") -> str:
    """A Prometheus scrape config (YAML) for the nodes' metrics endpoints, one target per node with its
    name and behaviour as labels."""
    out = ["# Prometheus scrape config for this local network (docs/operations.md):",
           "#   prometheus --config.file=prometheus.yml", "global:", f"  scrape_interval: {interval}",
           "scrape_configs:", "  - job_name: dso-localnet", "    static_configs:"]
    for n in nodes:
        if n.metrics_port:
            # not "role" or "uid": the nodes' own metrics carry those labels (dso_node_info, per-peer uid)
            labels = ", ".join(f"{k}: {json.dumps(v)}" for k, v in (("node", n.name), ("behaviour", n.behaviour)))
            out += [f"      - targets: [{json.dumps(f'{host}:{n.metrics_port}')}]", f"        labels: {{{labels}}}"]
    return "\n".join(out) + "\n"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON records of a node's log (a line still being written is skipped)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    out: list[dict[str, Any]] = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line being written right now
    return out


def wait_for(predicate: Callable[[], bool], timeout: float, step: float = 0.5,
             on_tick: Callable[[], None] | None = None) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        if on_tick:
            on_tick()
        time.sleep(step)
    return predicate()
