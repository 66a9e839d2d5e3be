"""The extensions with the real processes (embedded S3, LocalChain, miner and validator processes).

* commit-reveal on (3 honest miners + a copier): the copier can read nothing before commitments close, reveals a
  copy that cannot match its commitment and earns nothing; miners still hold the validator's model; the
  provenance ledger of the run verifies against its checkpoints and fails when a record or checkpoint is
  tampered with (scripts/verify_provenance.py);
* DP on with a budget of two rounds: the accountant stops each miner after two uploads, and a restarted miner
  stays stopped (its accountant state is on disk); a miner started with another extension setting refuses to
  run and names the key.

Windows: 16 blocks of 0.5 s with commit-reveal (put 3 s + reveal 3 s + settle + gather + training must fit),
8 blocks otherwise.
"""
from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from dso.nn.model import build_model, parameter_shapes
from dso.training.outer import OuterState
from neurons.manifest import run_of
from sim.localnet import ROOT, LocalNet, NodeSpec, plan_nodes, read_jsonl, wait_for
from storage import keys
from storage.checkpoint import save_checkpoint
from storage.jsonobj import encode_json, get_json

CR_WINDOWS = 8


def logs_of(net: LocalNet) -> dict[str, str]:
    return {p.name: p.read_text()[-2500:] for p in net.logs.glob("*.log")}


SCRIPT = ROOT / "scripts" / "verify_provenance.py"


def verify(net: LocalNet, *extra: str) -> subprocess.CompletedProcess:
    """The command as a user runs it."""
    return subprocess.run([sys.executable, str(SCRIPT), "--config", str(net.run_dir / "config.json"), *extra],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.fixture(scope="module")
def verify_here():
    """The same command's main() in this process (no interpreter start-up per call): (exit status, stdout)."""
    spec = importlib.util.spec_from_file_location("verify_provenance", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def run(net: LocalNet, capsys, *extra: str) -> tuple[int, str]:
        capsys.readouterr()
        status = module.main(["--config", str(net.run_dir / "config.json"), *extra])
        return status, capsys.readouterr().out

    return run


# ------------------------------------------------------------------ commit-reveal
@pytest.fixture(scope="module")
def cr_network(tmp_path_factory, stdlib_corpus, network_hparams):
    root = tmp_path_factory.mktemp("commit-reveal")
    hp = network_hparams()
    hp.commit_reveal, hp.put_window_seconds, hp.blocks_per_window = True, 3.0, 16
    net = LocalNet(root / "run", hp, plan_nodes(3, [("copier", 1)], 1), block_time=0.5,
                   corpus=str(stdlib_corpus), cache_dir=str(root / "cache"))
    with net:
        net.prepare()
        net.start()
        # the windows asked for, and every honest miner's update accepted in half as many (on a loaded machine they
        # join late: the network runs on for them until the timeout)
        honest = [n for n in net.nodes if n.role == "miner" and n.behaviour == "honest"]
        def accepted(lines: list[dict]) -> bool:
            return len(lines) >= CR_WINDOWS and all(
                sum(str(n.uid) not in line["rejections"] for line in lines) >= CR_WINDOWS // 2 for n in honest)
        wait_for(lambda: accepted(net.validator_lines()) or bool(net.dead()), timeout=300, step=0.5)
        assert len(net.validator_lines()) >= CR_WINDOWS and not net.dead(), logs_of(net)
        for node in net.nodes:  # the processes stop; the S3 server stays up for the provenance checks
            net.stop_node(node)
        yield net


def test_copier_gains_no_weight_under_commit_reveal(cr_network):
    net = cr_network
    copier = next(n for n in net.nodes if n.behaviour == "copier")
    honest = [n for n in net.nodes if n.role == "miner" and n.behaviour == "honest"]
    validator = next(n for n in net.nodes if n.role == "validator")
    lines = net.validator_lines()
    assert all(line["weights"].get(str(copier.uid), 0.0) == 0.0 for line in lines)
    posted = net.chain.weights().get(validator.uid)
    assert posted and posted.get(copier.uid, 0.0) == 0.0, posted
    assert sum(posted.get(n.uid, 0.0) for n in honest) == pytest.approx(1.0)
    reasons = [line["rejections"].get(str(copier.uid)) for line in lines]
    # it read the honest reveals and uploaded copies (a reveal is only made when something was read) …
    assert reasons.count("reveal_mismatch") >= 3, reasons
    # … and never once got an update accepted
    assert set(reasons) <= {"reveal_mismatch", "no_reveal", "missing"}, reasons
    assert all(str(copier.uid) not in map(str, line["aggregated"]) for line in lines)
    for miner in honest:  # honest miners pass the commit-reveal checks (a slow start on a loaded machine: missing)
        theirs = [line["rejections"].get(str(miner.uid)) for line in lines]
        assert set(theirs) <= {None, "missing"} and theirs.count(None) >= CR_WINDOWS // 2, (miner.name, theirs)


def test_the_validator_looks_at_the_commitments_before_anyone_reveals(cr_network):
    """Commitments are timed by the validator's own look, taken after the put window closed and over
    before the reveals begin (dso.protocol.clock.reveal_time), not by the LastModified a peer's server reports."""
    lines = cr_network.validator_lines()
    looks = [line["commitments_look"] for line in lines]
    taken = [look for look in looks if look is not None]
    assert len(taken) >= len(lines) // 2, looks  # a validator busy past ⌊close⌋ + 1.8 s skips it (LastModified)
    for look in taken:
        assert look["started_after_close"] >= 0.25, look  # not before ⌊close⌋ + 1.25 s: an absence then is proof
        last = look["last_answer_after_close"]
        assert last is None or last <= 2.0, look          # every answer counted came before ⌊close⌋ + 2 s
    assert max(look["seen"] for look in taken) >= 3, taken  # the honest miners' commitments, seen in time


def test_miners_hold_the_validators_model_under_commit_reveal(cr_network):
    net = cr_network
    reference = {line["window"]: line["model_hash"] for line in net.validator_lines()}
    for node in net.nodes:
        if node.role != "miner" or node.behaviour != "honest":
            continue
        lines = [m for m in read_jsonl(net.logs / f"{node.name}.jsonl") if m["window"] in reference]
        assert len(lines) >= CR_WINDOWS // 2, (node.name, len(lines))
        # every window it worked uploaded, but the first (it joins mid-window) and one more on a loaded machine
        assert sum(m["uploaded"] for m in lines[1:]) >= len(lines) - 2, node.name
        for m in lines:
            assert m["model_hash"] == reference[m["window"]], f"{node.name} diverged at window {m['window']}"
    losses = [line["val_loss"] for line in net.validator_lines()]
    assert losses[-1] < losses[0] - 0.05, losses


def test_provenance_of_the_run_verifies(cr_network, verify_here, capsys):
    out = verify(cr_network, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)
    assert result["ok"] and result["records"] >= CR_WINDOWS and len(result["checkpoints"]) >= 3, result
    assert result["source"].startswith("chain")
    assert result["windows"] == sorted(result["windows"])
    status, text = verify_here(cr_network, capsys, "--source", "bucket")
    assert status == 0 and text.startswith("OK"), text


def _validator_bucket(net: LocalNet):
    validator = next(n for n in net.nodes if n.role == "validator")
    creds = net.credentials(validator)
    return creds.write_client(), creds.bucket


def test_tampered_record_or_checkpoint_fails_verification(cr_network, verify_here, capsys):
    net = cr_network
    client, bucket = _validator_bucket(net)
    v = net.hp.protocol_version
    run = run_of(get_json(client, bucket, keys.manifest(net.hp.protocol_version)))
    records = sorted((keys.parse(o.key).window, o.key) for o in client.list(bucket, f"{run}/ledger/"))
    # a record of a window that aggregated someone (the first windows may have none while the miners join)
    with_contributors = [(w, k) for w, k in records if json.loads(client.get(bucket, k))["contributors"]]
    assert with_contributors, records
    # one with a successor to break, when there is one (on a loaded machine the miners may reach only the last)
    followed = [(w, k) for w, k in with_contributors if w < records[-1][0]] or with_contributors
    window, key = followed[len(followed) // 2]
    original = client.get(bucket, key)
    record = json.loads(original)
    try:
        # 1. a contributor's weight raised, record_hash left as it was: the record's own hash gives it away
        forged = json.loads(original)
        forged["contributors"][0]["weight"] = 0.99
        client.put(bucket, key, encode_json(forged))
        status, out = verify_here(net, capsys, "--source", "bucket")
        assert status == 1 and "record_hash does not match its content" in out, out
        # 2. the same forgery re-hashed: consistent alone, but the next record no longer links to it, and the
        #    copy differs from the chain's
        from dso.protocol.provenance import record_hash
        forged["record_hash"] = record_hash(forged)
        client.put(bucket, key, encode_json(forged))
        status, out = verify_here(net, capsys, "--source", "bucket")
        if window < records[-1][0]:
            assert status == 1 and f"does not link to the record of window {window}" in out, out
        status, out = verify_here(net, capsys)
        assert status == 1 and f"bucket record of window {window} differs from the chain's" in out, out
    finally:
        client.put(bucket, key, original)
    assert record["window"] == window

    # 3. a checkpoint replaced by a well-formed one of another model (θ_0): it loads, but is not the ledger's
    ckpts = sorted(keys.parse(o.key).window for o in client.list(bucket, f"{run}/checkpoint/")
                   if keys.parse(o.key) is not None and keys.parse(o.key).kind == "checkpoint")
    target = ckpts[-1]
    mine = [o.key for o in client.list(bucket, f"{run}/checkpoint/") if keys.parse(o.key) is not None
            and keys.parse(o.key).window == target] + [keys.latest_checkpoint(v, run)]
    originals = {key: client.get(bucket, key) for key in mine}  # the manifest, its shards, the pointer
    try:
        save_checkpoint(client, bucket, build_model(net.hp.model, net.hp.seed), target, net.hp, run,
                        OuterState.fresh(parameter_shapes(build_model(net.hp.model, net.hp.seed)), net.hp))
        status, out = verify_here(net, capsys)
        assert status == 1 and f"checkpoint of window {target - 1} has model" in out, out
    finally:
        for key, data in originals.items():
            client.put(bucket, key, data)
    assert verify_here(net, capsys)[0] == 0


# -------------------------------------------------------------------------- DP
def epsilon_after(rounds: int, z: float, delta: float) -> float:
    a = np.arange(2, 128, dtype=np.float64)
    return float((rounds * a * 4 / (2 * z * z) + np.log1p(-1 / a) - (math.log(delta) + np.log(a)) / (a - 1)).min())


DP_ROUNDS, DP_Z, DP_DELTA = 2, 2.0, 1e-6


@pytest.fixture(scope="module")
def dp_network(tmp_path_factory, stdlib_corpus, network_hparams):
    root = tmp_path_factory.mktemp("dp")
    hp = network_hparams()
    hp.dp.enabled, hp.dp.noise_multiplier, hp.dp.delta, hp.dp.target_epsilon = True, DP_Z, DP_DELTA, 0.0
    # halfway between the ε of two and of three rounds: exactly two rounds fit
    fits, exceeds = epsilon_after(DP_ROUNDS, DP_Z, DP_DELTA), epsilon_after(DP_ROUNDS + 1, DP_Z, DP_DELTA)
    hp.dp.epsilon_budget = (fits + exceeds) / 2
    refuser = NodeSpec("othersettings", "miner", extra_args=["--hparams.commit_reveal", "true"])
    net = LocalNet(root / "run", hp, plan_nodes(2, [], 1) + [refuser], block_time=0.5,
                   corpus=str(stdlib_corpus), cache_dir=str(root / "cache"))
    with net:
        net.prepare()
        for node in sorted(net.nodes, key=lambda n: n.role != "validator"):
            if node is not refuser:
                net.start_node(node)
        miners = [n for n in net.nodes if n.role == "miner" and n is not refuser]

        def lines(node):
            return read_jsonl(net.logs / f"{node.name}.jsonl")

        def alive() -> bool:
            return not any(n.process is not None and n.process.poll() is not None for n in net.nodes
                           if n is not refuser)

        stopped_twice = wait_for(lambda: all(sum(1 for m in lines(n) if m.get("privacy", {}).get("stopped")) >= 2
                                             for n in miners) or not alive(), timeout=180, step=0.5)
        assert stopped_twice and alive(), logs_of(net)
        before = len(lines(miners[0]))
        net.stop_node(miners[0])
        net.start_node(miners[0])  # same wallet, same state folder
        assert wait_for(lambda: len(lines(miners[0])) >= before + 2 or not alive(), timeout=120, step=0.5), \
            logs_of(net)
        net.start_node(refuser)
        refuser.process.wait(timeout=120)
        yield net, miners, refuser, before


def test_accountant_stops_each_miner_after_its_budget(dp_network):
    net, miners, _, _ = dp_network
    for node in miners:
        lines = read_jsonl(net.logs / f"{node.name}.jsonl")
        assert all(line["privacy"]["rounds"] <= DP_ROUNDS for line in lines)
        assert sum(line["uploaded"] for line in lines) <= DP_ROUNDS
        spent = [line for line in lines if line["privacy"]["rounds"] == DP_ROUNDS]
        assert spent and all(not line["uploaded"] for line in spent[1:]), lines
        assert all(line["privacy"]["stopped"] for line in spent[1:])
        assert spent[-1]["privacy"]["epsilon"] == pytest.approx(epsilon_after(DP_ROUNDS, DP_Z, DP_DELTA), rel=1e-9)
        assert spent[-1]["privacy"]["epsilon"] <= net.hp.dp.epsilon_budget
        log = (net.logs / f"{node.name}.log").read_text()
        assert f"privacy budget ε={net.hp.dp.epsilon_budget:g} reached" in log and "not uploading any more" in log
    # the validator sees nothing from them once they stopped
    last = net.validator_lines()[-1]
    assert all(last["rejections"].get(str(n.uid)) == "missing" for n in miners), last["rejections"]


def test_restarted_miner_stays_stopped(dp_network):
    net, miners, _, before = dp_network
    node = miners[0]
    state = json.loads((net.run_dir / "state" / f"{node.name}-default" / "miner" / "privacy.json").read_text())
    assert state["rounds"] == DP_ROUNDS
    after = read_jsonl(net.logs / f"{node.name}.jsonl")[before:]
    assert len(after) >= 2 and not any(line["uploaded"] for line in after), after
    assert all(line["privacy"]["rounds"] == DP_ROUNDS and line["privacy"]["stopped"] for line in after)
    log = (net.logs / f"{node.name}.log").read_text()
    assert log.count("not uploading any more") >= 2            # said so again after the restart
    assert f"ε spent {epsilon_after(DP_ROUNDS, DP_Z, DP_DELTA):.4f}" in log  # the restart read the saved state


def test_miner_with_another_extension_setting_refuses_to_run(dp_network):
    net, _, refuser, _ = dp_network
    assert refuser.process.returncode == 1
    log = (net.logs / f"{refuser.name}.log").read_text()
    assert "refusing to run" in log and "hparams.commit_reveal: ours True, run False" in log, log[-2000:]
