"""The whole network on this machine, in one command: `make run`, `python scripts/localnet.py`, `dso-localnet`.

    python scripts/localnet.py [--windows 12] [--miners 4] [--adversary KIND[:COUNT] ...]
                               [--validators 1] [--report-dir runs/localnet] [--seed 1234]
                               [--set hparams.KEY=VALUE ...]

Starts the embedded S3 server (moto, IAM auth on) and a LocalChain, publishes
the corpus to a dataset bucket on that server (every node reads it from there;
``--data.local``: from the local shards), creates,
registers and funds wallets, starts the validators (different stakes) and the
miners — N honest ones plus every ``--adversary`` — as separate processes,
shows a live table while W windows run (one plain line per window when the
output is not a terminal), then stops everything and writes ``report.json``,
``report.md``, PNG plots and a self-contained ``report.html`` to the report
folder.  Ctrl-C or SIGTERM stops early and still writes the report for the
finished windows.  Every node serves Prometheus metrics on a free port;
``run/prometheus.yml`` is a scrape config for them (docs/operations.md).

Without ``--adversary`` the mix is: 1 diligent, 1 freerider, 1 noise,
1 copier, 1 malformed, 1 late.  Behaviours: see ``sim/behaviours/``.
"""
from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from dso.config.schema import Config, ConfigError, HParams
from dso.config.sources import profile_names, set_hparams, use_profile
from dso.data.corpus import DataError
from dso.data.dataset import Dataset, corpus_tokenizer, is_remote_corpus
from sim import report as run_report
from sim.behaviours import BEHAVIOURS, GOOD
from sim.localnet import LocalNet, plan_nodes
from sim.progress import View
from sim.reference import REFERENCE_SECONDS, adamw_reference, network_tokens
from sim.report_schema import Report
from sim.sample import Sample
from storage.engines import ENGINES, ExternalEngine, engine_problem

DEFAULT_MIX = [("diligent", 1), ("freerider", 1), ("noise", 1), ("copier", 1), ("malformed", 1), ("late", 1)]


def adversary(text: str) -> tuple[str, int]:
    kind, _, count = text.partition(":")
    if kind not in BEHAVIOURS:
        raise argparse.ArgumentTypeError(f"unknown behaviour {kind!r}; choose from {', '.join(BEHAVIOURS)}")
    try:
        n = int(count) if count else 1
    except ValueError:
        raise argparse.ArgumentTypeError(f"count in {text!r} must be a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"count in {text!r} must be at least 1")
    return kind, n


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, HParams]:
    """The command line, checked, and the run's hyper-parameters (profile, shards' tokeniser, ``--set``)."""
    p = parser()
    args = p.parse_args(argv)
    problem = args_problem(args)
    if problem:
        p.error(problem)
    try:
        return args, run_hparams(args)
    except (ConfigError, DataError) as e:
        p.error(str(e))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--windows", type=positive, default=12, help="windows to run (default 12, ~5 minutes)")
    p.add_argument("--miners", type=int, default=4, help="honest miners (default 4)")
    p.add_argument("--adversary", type=adversary, action="append", metavar="KIND[:COUNT]",
                   help="add COUNT miners of a behaviour (repeatable; default mix when absent)")
    p.add_argument("--validators", type=positive, default=1, help="validators, with decreasing stakes (default 1)")
    p.add_argument("--miner-ranks", type=positive, default=1, metavar="N",
                   help="run the first honest miner as a torchrun group of N ranks (FSDP2 over gloo; docs/scale.md)")
    p.add_argument("--report-dir", default="runs/localnet", help="report and run files (default runs/localnet)")
    p.add_argument("--seed", type=int, default=None, help="run seed (model init, data assignment)")
    p.add_argument("--profile", default="default", metavar="NAME",
                   help=f"the protocol variant every node runs, configs/NAME.toml: one of {', '.join(profile_names())} "
                        "(default: default); --set overrides it")
    p.add_argument("--set", action="append", default=[], metavar="hparams.KEY=VALUE",
                   help="override a run hyper-parameter, e.g. --set hparams.commit_reveal=true")
    p.add_argument("--block-time", type=float, default=1.0, help="seconds per block (default 1)")
    p.add_argument("--storage.engine", dest="engine", choices=ENGINES, default="moto",
                   help="S3 server the network starts on loopback: moto (default) or seaweedfs")
    p.add_argument("--storage.endpoint", dest="endpoint", default="",
                   help="run against this S3 endpoint instead of starting one; needs --storage.credentials")
    p.add_argument("--storage.credentials", dest="credentials", default="", metavar="DIR",
                   help="with --storage.endpoint: one NAME.json of keys per node (docs/deployment.md)")
    p.add_argument("--data.corpus", dest="corpus", default="shakespeare",
                   help="'shakespeare', a text file or folder, or shards made by scripts/prepare_data.py "
                        "(their tokeniser becomes the run's unless --set says otherwise)")
    p.add_argument("--data.cache_dir", dest="cache_dir", default="~/.cache/dso", help="tokenised data cache")
    p.add_argument("--data.tokenizer_file", dest="tokenizer_file", default="",
                   help="a BPE tokenizer.json every node loads instead of training one")
    p.add_argument("--data.local", dest="data_local", action="store_true",
                   help="every node reads the local shards instead of the dataset bucket the network publishes "
                        "its corpus to (docs/data.md)")
    p.add_argument("--no-adversaries", action="store_true", help="honest miners only (no default mix)")
    p.add_argument("--no-metrics", action="store_true", help="no Prometheus endpoints on the nodes")
    p.add_argument("--no-fork", action="store_true",
                   help="start every node as a fresh interpreter (default: fork the single-process nodes from one "
                        "that imported torch once, about 1 s to every node up instead of 10-30 s)")
    p.add_argument("--kill-leader-after", type=positive, default=None, metavar="N",
                   help="SIGKILL the leading validator after it scored N windows: the next one takes over "
                        "(needs --validators 2 or more; the report's Validators section shows the hand-over)")
    p.add_argument("--reference-seconds", type=float, default=REFERENCE_SECONDS, metavar="S",
                   help="after the run, at most S seconds for the report's reference curve: centralised AdamW "
                        "on the tokens the miners trained on (cached by settings; 0 = none; default "
                        f"{REFERENCE_SECONDS:g})")
    return p


def args_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with a combination of flags (None: nothing)."""
    if args.miners < 0:
        return "--miners must be >= 0"
    if args.miner_ranks > 1 and args.miners < 1:
        return "--miner-ranks needs an honest miner (--miners 1 or more)"
    if bool(args.endpoint) != bool(args.credentials):
        return "--storage.endpoint and --storage.credentials go together"
    problem = None if args.endpoint else engine_problem(args.engine)
    if problem:
        return problem
    if args.no_adversaries and args.adversary:
        return "--no-adversaries and --adversary exclude each other"
    if not args.block_time > 0:
        return "--block-time must be > 0"
    if args.kill_leader_after is not None and args.validators < 2:
        return "--kill-leader-after needs --validators 2 or more (someone must take over)"
    if is_remote_corpus(args.corpus):
        return (f"--data.corpus {args.corpus}: the local network publishes its corpus itself; pass the text or "
                "shard folder (nodes on other machines take --data.corpus s3://… directly)")
    return None


def run_hparams(args: argparse.Namespace) -> HParams:
    """The profile, the shards' tokeniser (unless ``--set`` overrides it), ``--set`` and ``--seed``, validated;
    raises ConfigError or DataError."""
    cfg = Config()
    use_profile(cfg.hparams, args.profile)
    shards = corpus_tokenizer(args.corpus)
    if shards is not None:  # the shards' tokeniser is the run's, unless --set overrides it below
        cfg.hparams.tokenizer, cfg.hparams.model.vocab_size = shards.kind, shards.vocab_size
    set_hparams(cfg, args.set)
    if args.seed is not None:
        cfg.hparams.seed = args.seed
    cfg.validate()
    return cfg.hparams


def stop_on_sigterm() -> None:
    """SIGTERM (systemctl stop, timeout, a container runtime) stops the run as Ctrl-C does: the nodes stop
    and save, the report is written.  Further SIGTERMs are ignored while that happens."""
    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def nodes_up(net: LocalNet) -> int:
    """Nodes that finished their start-up (their log has the context's "uid … hotkey" line)."""
    up = 0
    for node in net.nodes:
        try:
            up += " hotkey " in (net.logs / f"{node.name}.log").read_text(errors="replace")
        except OSError:
            pass
    return up


def training_data(hp: HParams, args: argparse.Namespace) -> Dataset | None:
    """The run's data set (as every node loads it: cached), for the report's corpus figures; None if it
    cannot be loaded."""
    try:
        return Dataset.for_run(hp, args.corpus, args.cache_dir, args.tokenizer_file)
    except (DataError, OSError, ValueError):
        return None


def final_samples(state: Path, hp: HParams, tokenizer: Any, say: Any,
                  validator: str = "validator0") -> list[Sample]:
    """Two samples (seeded, temperature 0.8) from the leading validator's last saved model, [] without one."""
    from sim.sample import CheckpointError, checkpoint_window, load_model, samples_from
    folder = next(iter(sorted(state.glob(f"{validator}-*/validator"))), None)
    if folder is None:
        return []
    try:
        return samples_from(load_model(folder, hp), tokenizer, checkpoint_window(folder) or -1)
    except (CheckpointError, OSError, ValueError) as e:
        say(f"no sampled text: {e}")
        return []


def main_validator(killed: list[str]) -> str:
    """The validator whose lines the run follows and reports: the first, or after it was killed the next."""
    return "validator1" if killed else "validator0"


def kill_leader(net: LocalNet, say: Any) -> str:
    """SIGKILL the first (largest-stake) validator, as a crash would; returns its name."""
    leader = next(n for n in net.nodes if n.name == "validator0")
    net.stop_node(leader, signal.SIGKILL)
    say("killed validator0 (SIGKILL): validator1 takes over once the chain sees validator0 idle")
    return leader.name


def run(argv: list[str] | None = None) -> int:
    args, hp = parse(argv)
    mix = [] if args.no_adversaries else (args.adversary if args.adversary is not None else DEFAULT_MIX)
    nodes = plan_nodes(args.miners, mix, args.validators, args.miner_ranks)
    out = Path(args.report_dir)
    external = ExternalEngine(args.endpoint, args.credentials) if args.endpoint else None
    net = LocalNet(out / "run", hp, nodes, block_time=args.block_time, engine=args.engine, s3=external,
                   corpus=args.corpus, cache_dir=args.cache_dir, tokenizer_file=args.tokenizer_file,
                   metrics=not args.no_metrics, data_bucket=not args.data_local, fork=not args.no_fork)
    started = time.time()
    command = "python scripts/localnet.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    view = View(Console(), {}, args.windows, started)
    killed: list[str] = []  # validators this run killed on purpose (--kill-leader-after)
    stop_on_sigterm()
    failed, posted = drive(net, args, view, killed)
    if failed:
        view.say(failed)
        return 1
    report = build_report(net, hp, args, view, main_validator(killed), posted)
    view.say(f"writing the report ({report['windows']} windows) to {out}")
    run_report.write(report, out, command)
    s = report["summary"]
    loss = [f"{v:.4f}" if v is not None else "—" for v in (s["val_loss_first"], s["val_loss_last"])]
    view.say(f"{report['windows']} windows in {time.time() - started:.0f}s; validation loss "
             f"{loss[0]} → {loss[1]} nats/token ({_bits(report.get('final_val_bits_per_byte'))} bits/byte, unigram "
             f"{_bits(report.get('unigram_bits_per_byte'))}); honest+diligent weight {100 * s['good_share']:.1f}%, "
             f"largest adversary {100 * s['max_adversary_share']:.2f}%; report in {out}/report.md and "
             f"{out}/report.html")
    return 0


def drive(net: LocalNet, args: argparse.Namespace, view: View, killed: list[str]
          ) -> tuple[str, dict[int, float] | None]:
    """Prepare and start the network, follow it until the windows are done (or it fails, or a signal comes),
    then stop every process.  Returns (why it failed, "" if it did not; the weights the followed validator
    posted last)."""
    nodes, failed = net.nodes, ""
    try:
        view.step(f"preparing {len(nodes)} nodes (data, embedded S3, LocalChain, wallets)")
        net.prepare(view.step)
        view.names = {n.uid: (n.name, n.behaviour) for n in nodes if n.role == "miner"}
        net.start(view.step)
        view.say(f"started; run files in {net.run_dir}, logs in {net.logs}")
        if net.metrics:
            ports = ", ".join(f"{n.name} :{n.metrics_port}" for n in nodes[:3])
            view.say(f"metrics: {ports}{', …' if len(nodes) > 3 else ''} (http://127.0.0.1:PORT/metrics); "
                     f"Prometheus scrape config {net.run_dir / 'prometheus.yml'}")
        follow_windows(net, args, view, killed)
    except KeyboardInterrupt:
        view.close()
        view.say("stopping (signal); the report covers the finished windows")
    except (DataError, RuntimeError) as e:
        failed = str(e)
    finally:
        view.close()
        posted = None
        if net.chain is not None:
            leader = next((n.uid for n in nodes if n.name == main_validator(killed)), None)
            posted = net.chain.weights().get(leader) if leader is not None else None
        stopping = time.time()
        net.stop()
        view.say(f"all processes stopped in {time.time() - stopping:.1f} s")
    return failed, posted


def follow_windows(net: LocalNet, args: argparse.Namespace, view: View, killed: list[str]) -> None:
    """Show the live table until the followed validator scored ``--windows`` windows or exited; kill the
    leader on the way when ``--kill-leader-after`` says so."""
    while True:
        lines = net.validator_lines(main_validator(killed))
        view.update(lines, "" if lines else f"waiting for the first window: {nodes_up(net)}/{len(net.nodes)} nodes up")
        if len(lines) >= args.windows:
            return
        if args.kill_leader_after and not killed and len(lines) >= args.kill_leader_after:
            killed.append(kill_leader(net, view.say))
        dead = [n.name for n in net.dead() if n.role == "validator" and n.name not in killed]
        if dead:
            view.close()
            view.say(f"validator {dead[0]} exited; see {net.logs / (dead[0] + '.log')}")
            return
        time.sleep(1.0)


def build_report(net: LocalNet, hp: HParams, args: argparse.Namespace, view: View, followed: str,
                 posted: dict[int, float] | None) -> Report:
    """The run's report from the nodes' logs (``followed``: the validator whose lines it reports), with the
    corpus figures, samples of the final model and the centralised reference when the data loads."""
    nodes = net.nodes
    validators = {n.name: net.validator_lines(n.name) for n in nodes if n.role == "validator"}
    lines = validators.get(followed) or net.validator_lines()  # the leading validator's (read once)
    by_name = net.miner_lines()
    miners = {n.uid: by_name.get(n.name, []) for n in nodes if n.role == "miner"}
    dataset = training_data(hp, args)
    unigram = run_report.corpus_unigram_bits_per_byte(dataset) if dataset is not None else None
    report = run_report.build(lines, {n.uid: (n.name, n.behaviour) for n in nodes if n.role == "miner"}, posted,
                              validators, miners, unigram)
    report["data_source"] = net.data_source  # where every node read the corpus: the dataset bucket's s3:// URL
    if dataset is None:
        return report
    report["samples"] = final_samples(net.run_dir / "state", hp, dataset.tokenizer, view.say, followed)
    if args.reference_seconds > 0:
        good = {n.uid for n in nodes if n.role == "miner" and n.behaviour in GOOD}
        per_window = network_tokens(miners, good)
        reference = adamw_reference(hp, dataset, sum(per_window.values()), args.cache_dir, args.reference_seconds,
                                    view.say)
        run_report.add_reference(report, reference, per_window)
    return report


def _bits(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def cli() -> None:
    """Console entry point ``dso-localnet``."""
    sys.exit(run())
