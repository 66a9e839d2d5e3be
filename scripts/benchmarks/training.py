"""Training section: the network with inner steps against DDP AdamW and against paper mode, at equal tokens.

Runs, all from the same θ_0 on the same assigned sequences (``sim/training.py``: the miners' inner loop,
the network's outer step, and the DDP baseline):

* ``network`` — P peers, W windows of H inner steps (the run's defaults: inner AdamW, DeMo codec
  with error feedback, the outer rule);
* ``ddp`` — data-parallel AdamW, one all-reduce per step: W·H steps, each on the mean gradient of
  every peer's batch (full mode: the best peak lr of a small sweep; every sweep value is reported);
* ``paper`` — H = 1: one gradient per window, the Gauntlet's signed step, W·H windows (equal tokens);
* ``network_overlap`` (full mode) — the same, each peer taking the first step of window t+1 from
  θ_t before θ_{t+1} is known and rebasing onto it, as the miner does (dso.training.inner.InnerLoop.rebase);
* ``localnet_regime`` / ``localnet_ddp`` (full mode) — what ``make run`` can reach: 20 windows ×
  3 inner steps × 6 peers, and DDP AdamW on the same tokens.

Figures: ``loss_ratio_vs_ddp`` = final validation loss network ÷ DDP (target ≤ 1.05);
``bytes_ratio_vs_ddp`` = bytes of a bf16 all-reduce of the same H steps (H · 2 B · parameters, the
message one peer contributes; a ring all-reduce sends 2(N−1)/N of it) ÷ bytes one peer uploads per
window (the payload object) — "the peer sends X× fewer bytes", target ≥ 1000;
``miner_utilisation`` from a local-network report (env ``DSO_LOCALNET_REPORT``, else ``make run``'s
``runs/localnet/report.json``) or null.  Quick mode: the tiny test model, 2 peers × 2 windows × 2 steps, in
this process (a few seconds).
Losses in nats per token and bits per byte.  Also the codec's energy table (:func:`codec_energy`).

``python scripts/benchmarks/training.py --variant NAME:key=value,... [--variant ...]`` runs any set
of variants side by side (how the defaults were chosen; the commands are in docs/training.md); ``--out F.json``
also writes the table (``F.md``) and the curves (``F.png``) beside it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # run as a script: make `benchmarks` and `dso` importable
    sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])]

from benchmarks.common import ROOT, finite_or_none, save_plot, worker_pool  # noqa: E402
from dso.config.sources import profile_settings  # noqa: E402

FULL = {"peers": 4, "windows": 12, "steps": 6, "ddp_lrs": (1e-3, 2e-3, 4e-3), "localnet": True, "tiny": False,
        "workers": 2}
# small enough for a smoke test: the tiny test model, in this process (no worker start-up)
QUICK = {"peers": 2, "windows": 2, "steps": 2, "ddp_lrs": (2e-3,), "localnet": False, "tiny": True, "workers": 0}
LOCALNET = {"peers": 6, "windows": 20, "steps": 3}
PLOT = ROOT / "docs" / "img" / "training.png"
TAIL = 3  # windows averaged for the less noisy comparison
UTILISATION_ENV = "DSO_LOCALNET_REPORT"
DEFAULT_REPORT = ROOT / "runs" / "localnet" / "report.json"  # where ``make run`` writes its report


# ------------------------------------------------------------------ runs
def hparams(tiny: bool = False, overrides: dict | None = None):
    """The run's hyper-parameters: defaults (or the tiny test model) with dotted ``hparams`` overrides."""
    from dso.config.schema import Config, ModelConfig
    from dso.config.sources import set_key

    cfg = Config()
    if tiny:
        hp = cfg.hparams
        hp.tokenizer = "bytes"
        hp.model = ModelConfig(vocab_size=256, d_model=32, n_layers=1, n_heads=2, ffn_hidden=64, seq_len=32)
        hp.batch_size, hp.assigned_sequences, hp.micro_batch, hp.chunk, hp.topk = 8, 16, 8, 16, 8
        hp.inner.steps_max, hp.val_sequences = 2, 8
    for key, value in (overrides or {}).items():
        set_key(cfg, f"hparams.{key}", value)
    return cfg.validate().hparams


def run_variant(spec: dict) -> dict:
    """One training run (in a worker process, or in this one).  ``spec``: kind (network | ddp), peers,
    windows, steps, ``set`` (dotted HParams overrides), overlap, lr (ddp), tiny."""
    from benchmarks.common import default_dataset, setup_worker
    setup_worker()
    from dso.training.train import bits_per_byte
    from sim.training import run_ddp, run_network

    hp = hparams(spec.get("tiny", False), spec.get("set"))
    dataset = default_dataset(hp)
    val = dataset.validation(hp.val_sequences)
    bits_per_nat = bits_per_byte(1.0, int(val[:, 1:].numel()), dataset.target_bytes(val))
    started = time.process_time()
    if spec["kind"] == "ddp":
        hist = run_ddp(hp, dataset, spec["peers"], spec["windows"], spec["steps"], lr=spec.get("lr"))
    else:
        hist = run_network(hp, dataset, spec["peers"], spec["windows"], spec["steps"], overlap=spec.get("overlap", 0))
    return {"spec": spec, "val_loss": [finite_or_none(x) for x in hist.val_loss], "tokens": hist.tokens,
            "train_loss": [finite_or_none(x) for x in hist.train_loss], "update_bytes": hist.update_bytes,
            "bits_per_nat": bits_per_nat,
            "seconds": round(hist.seconds, 1), "cpu_seconds": round(time.process_time() - started, 1)}


def run_all(specs: dict[str, dict], workers: int = 2) -> dict[str, dict]:
    """Every spec's run; ``workers = 0`` runs them one after the other in this process."""
    if workers <= 0:
        out = {name: run_variant(spec) for name, spec in specs.items()}
        for name, r in out.items():
            print(f"training: {name} final {r['val_loss'][-1]}", file=sys.stderr, flush=True)
        return out
    with worker_pool(workers) as pool:
        futures = {name: pool.submit(run_variant, spec) for name, spec in specs.items()}
        out = {}
        for name, future in futures.items():
            out[name] = future.result()
            print(f"training: {name} final {out[name]['val_loss'][-1]}", file=sys.stderr, flush=True)
        return out


def network_spec(peers: int, windows: int, steps: int, tiny: bool = False, **over) -> dict:
    return {"kind": "network", "peers": peers, "windows": windows, "steps": steps, "set": over, "tiny": tiny}


def paper_set() -> dict:
    """The Gauntlet paper's setup (the ``gauntlet`` profile)."""
    return profile_settings("gauntlet")


# --------------------------------------------------------------- figures
def final(curve: list) -> float:
    x = curve[-1] if curve else None
    return x if x is not None and math.isfinite(x) else math.inf


def tail_mean(curve: list, n: int = TAIL) -> float:
    tail = curve[-n:]
    if not tail or any(x is None or not math.isfinite(x) for x in tail):
        return math.inf
    return sum(tail) / len(tail)


def ratio(a: float, b: float) -> float | None:
    return a / b if math.isfinite(a) and math.isfinite(b) and b else None


def bits_of(nats: float | None, per_nat: float = 1 / math.log(2)) -> float | None:
    """Bits per byte of a per-token loss: ``per_nat`` is the validation batch's bits per byte for one nat
    per token (tokens ÷ (bytes · ln 2)); the default is a byte-level tokeniser's (one token per byte)."""
    return None if nats is None or not math.isfinite(nats) else nats * per_nat


def allreduce_bytes(parameters: int, steps: int, bytes_per_value: int = 2) -> int:
    """What one peer contributes to the all-reduces of ``steps`` DDP steps (bf16 gradients)."""
    return steps * parameters * bytes_per_value


def bytes_ratio(parameters: int, steps: int, peer_bytes: int) -> float | None:
    """bf16 all-reduce bytes of the same steps ÷ the bytes one peer uploads per window (≥ 1 = fewer)."""
    return allreduce_bytes(parameters, steps) / peer_bytes if peer_bytes > 0 else None


def payload_object_bytes(hp) -> int:
    """Size of one real payload object (safetensors header + compressed update + sync samples)."""
    import torch

    from dso.codec.demo import DeMoCodec
    from dso.nn.model import build_model, parameter_shapes
    from dso.protocol.payload import PayloadMeta
    from storage.wire import encode_payload

    codec = DeMoCodec.from_hparams(parameter_shapes(build_model(hp.model, hp.seed)), hp)
    update = codec.compress({n: torch.randn(s) for n, s in codec.shapes.items()}, 99999)
    meta = PayloadMeta(uid=255, window=99999, protocol_version=hp.protocol_version, hparams_digest=hp.digest(),
                       data_hash="0" * 64, model_hash="0" * 64)
    return len(encode_payload(codec, update, torch.zeros(hp.sync_samples), meta))


def report_path() -> Path | None:
    """The local-network report to read utilisation from: ``$DSO_LOCALNET_REPORT``, else ``make run``'s."""
    env = os.environ.get(UTILISATION_ENV)
    if env:
        return Path(env)
    return DEFAULT_REPORT if DEFAULT_REPORT.is_file() else None


def miner_utilisation(path: str | Path | None) -> float | None:
    """The least-utilised miner's training seconds ÷ window seconds from a local-network report
    (``miner_utilisation``: a number, or a mapping uid → mean over its windows); None without a readable
    report."""
    if not path:
        return None
    try:
        value = json.loads(Path(path).read_text()).get("miner_utilisation")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(value, dict):
        numbers = [v for v in value.values() if isinstance(v, (int, float))]
        return float(min(numbers)) if numbers else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def summarise(runs: dict[str, dict], cfg: dict, parameters: int, payload_bytes: int,
              utilisation: float | None = None, utilisation_source: str | None = None) -> dict:
    ddp_names = [n for n in runs if n.startswith("ddp_lr")]
    best = min(ddp_names, key=lambda n: final(runs[n]["val_loss"]))
    net, ddp, paper = runs["network"]["val_loss"], runs[best]["val_loss"], runs["paper"]["val_loss"]
    per_nat = runs["network"].get("bits_per_nat", 1 / math.log(2))

    def bits(nats: float | None) -> float | None:
        return bits_of(nats, per_nat)

    out = {
        "peers": cfg["peers"], "windows": cfg["windows"], "inner_steps": cfg["steps"],
        "tokens": runs["network"]["tokens"][-1],
        "initial_nats": finite_or_none(net[0]) if net else None,
        "network_nats": finite_or_none(final(net)), "network_bits_per_byte": bits(final(net)),
        "ddp_nats": finite_or_none(final(ddp)), "ddp_bits_per_byte": bits(final(ddp)),
        "ddp_lr": runs[best]["spec"].get("lr"),
        "ddp_sweep": {str(runs[n]["spec"].get("lr")): finite_or_none(final(runs[n]["val_loss"])) for n in ddp_names},
        "paper_nats": finite_or_none(final(paper)), "paper_bits_per_byte": bits(final(paper)),
        "loss_ratio_vs_ddp": ratio(final(net), final(ddp)),
        "loss_ratio_vs_ddp_tail": ratio(tail_mean(net), tail_mean(ddp)),
        "loss_ratio_paper_vs_ddp": ratio(final(paper), final(ddp)),
        "update_bytes": runs["network"]["update_bytes"], "payload_bytes": payload_bytes,
        "allreduce_bytes_per_window": allreduce_bytes(parameters, cfg["steps"]),
        "bytes_ratio_vs_ddp": bytes_ratio(parameters, cfg["steps"], payload_bytes),
        "miner_utilisation": utilisation, "miner_utilisation_source": utilisation_source,
        "parameters": parameters, "bits_per_nat": per_nat, "tiny_model": bool(cfg.get("tiny")),
        "cpu_seconds": {n: r["cpu_seconds"] for n, r in runs.items()},
    }
    if "network_overlap" in runs:
        curve = runs["network_overlap"]["val_loss"]
        out["network_overlap_nats"] = finite_or_none(final(curve))
        out["network_overlap_bits_per_byte"] = bits(final(curve))
        out["loss_ratio_overlap_vs_ddp"] = ratio(final(curve), final(ddp))
    if "localnet_regime" in runs:
        curve = runs["localnet_regime"]["val_loss"]
        out["localnet_regime"] = {**LOCALNET, "nats": finite_or_none(final(curve)), "bits_per_byte": bits(final(curve)),
                                  "ddp_nats": finite_or_none(final(runs["localnet_ddp"]["val_loss"])),
                                  "ddp_bits_per_byte": bits(final(runs["localnet_ddp"]["val_loss"]))}
    return out


# ------------------------------------------------------------------ run
def run(quick: bool) -> dict:
    from dso.nn.model import build_model, parameter_count

    cfg = QUICK if quick else FULL
    p, w, h, tiny = cfg["peers"], cfg["windows"], cfg["steps"], cfg["tiny"]
    specs = {"network": network_spec(p, w, h, tiny), "paper": network_spec(p, w * h, 1, tiny, **paper_set())}
    if not quick:  # the miner trains through the put window: one step of t+1 before θ_{t+1}, then rebase
        specs["network_overlap"] = {**network_spec(p, w, h, tiny), "overlap": 1}
    specs.update({f"ddp_lr{lr:g}": {"kind": "ddp", "peers": p, "windows": w, "steps": h, "lr": lr, "tiny": tiny}
                  for lr in cfg["ddp_lrs"]})
    if cfg["localnet"]:
        specs["localnet_regime"] = network_spec(**LOCALNET)
        specs["localnet_ddp"] = {"kind": "ddp", **LOCALNET}
    runs = run_all(specs, cfg["workers"])
    hp = hparams(tiny)
    source = report_path()
    out = summarise(runs, cfg, parameter_count(build_model(hp.model, hp.seed)), payload_object_bytes(hp),
                    miner_utilisation(source), str(source) if source else None)
    out["codec_energy"] = codec_energy(quick, hp)
    out["curves"] = {n: r["val_loss"] for n, r in runs.items()}
    if not quick:
        plot(runs, PLOT)
        out["plot"] = str(PLOT.relative_to(ROOT))
    return out


# ---------------------------------------------------------- codec energy
def codec_energy(quick: bool, hp, rounds: int | None = None) -> dict:
    """Share of the error-feedback buffer's energy each codec setting removes per round,
    ``1 − ‖e_after‖² / ‖β·e + g‖²`` (quantisation error counts against it), averaged over rounds
    after the first quarter, on real updates of the default model: inner-loop pseudo-gradients (3
    AdamW steps per round) and plain gradients (paper mode)."""
    from benchmarks.energy import energy_table, record_updates
    rounds = rounds or (3 if quick else 16)
    streams = record_updates(rounds, steps=3, hp=hp)
    grid = {"topk": (4, 8) if quick else (8, 16, 32, 64), "bits": (2, 4) if quick else (2, 3, 4, 8, 32)}
    return energy_table(streams, grid["topk"], grid["bits"], skip=max(1, rounds // 4), hp=hp)


# ------------------------------------------------------------------ text
def markdown(result: dict) -> str:
    def f(x, nd=4):
        return "—" if x is None else f"{x:.{nd}f}"
    lines = [f"{result['peers']} peers × {result['windows']} windows × {result['inner_steps']} inner steps "
             f"({result['tokens']} tokens); validation loss at start {f(result['initial_nats'])} nats/token", "",
             "| run | nats/token | bits/byte |", "|---|---:|---:|",
             f"| network (defaults) | {f(result['network_nats'])} | {f(result['network_bits_per_byte'])} |",
             f"| DDP AdamW, lr {result['ddp_lr']:g} | {f(result['ddp_nats'])} | {f(result['ddp_bits_per_byte'])} |",
             f"| paper mode (H = 1, signed) | {f(result['paper_nats'])} | {f(result['paper_bits_per_byte'])} |"]
    if "network_overlap_nats" in result:
        lines.append(f"| network, training through the put window (rebase) | {f(result['network_overlap_nats'])} | "
                     f"{f(result['network_overlap_bits_per_byte'])} |")
    if "localnet_regime" in result:
        r = result["localnet_regime"]
        lines.append(f"| local-network regime ({r['peers']} peers × {r['windows']} × {r['steps']}) | {f(r['nats'])} "
                     f"| {f(r['bits_per_byte'])} (DDP {f(r['ddp_bits_per_byte'])}) |")
    lines += ["", f"loss_ratio_vs_ddp = {f(result['loss_ratio_vs_ddp'])} (last {TAIL}: "
              f"{f(result['loss_ratio_vs_ddp_tail'])}); paper/DDP = {f(result['loss_ratio_paper_vs_ddp'])}",
              f"bytes_ratio_vs_ddp = {f(result['bytes_ratio_vs_ddp'], 0)} (payload {result['payload_bytes']} B vs "
              f"bf16 all-reduce {result['allreduce_bytes_per_window']} B per window); miner_utilisation = "
              f"{f(result['miner_utilisation'], 2)}"]
    energy = result.get("codec_energy", {})
    if energy:
        lines += ["", "| energy sent per round | " + " | ".join(energy["columns"]) + " |",
                  "|---|" + "---:|" * len(energy["columns"])]
        lines += [f"| {row} | " + " | ".join(f(v, 4) for v in values) + " |" for row, values in energy["rows"].items()]
    return "\n".join(lines)


def plot(runs: dict[str, dict], path: Path,
         title: str = "Network with inner steps vs DDP AdamW and paper mode (equal tokens)") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name, r in runs.items():
        if name.startswith("localnet"):
            continue
        xs = [t / 1e6 for t, y in zip(r["tokens"], r["val_loss"], strict=True) if y is not None]
        ys = [y * r["bits_per_nat"] for y in r["val_loss"] if y is not None]
        ax.plot(xs, ys, label=name.replace("_", " "), linewidth=1.4 if not name.startswith("ddp") else 1.0)
    save_plot(fig, ax, path, "training tokens (millions)", "validation loss (bits per byte)", title)


# ---------------------------------------------------------------- sweeps
def parse_variant(text: str, peers: int, windows: int, steps: int) -> tuple[str, dict]:
    """``name[:key=value,...]`` → a network spec; ``ddp:LR[,key=value,...]`` → a DDP run; ``paper`` → paper
    mode.  Keys are HParams keys (``outer.lr``, ``tokenizer``) plus ``peers``, ``windows``, ``steps`` and
    ``overlap``."""
    name, _, rest = text.partition(":")
    items = [item for item in rest.split(",") if item]
    if name == "ddp":
        lr = items.pop(0)
        name = f"ddp_lr{lr}"
        spec = {"kind": "ddp", "peers": peers, "windows": windows, "steps": steps, "lr": float(lr), "set": {}}
    else:
        spec = network_spec(peers, windows, steps, **(paper_set() if name == "paper" else {}))
        if name == "paper":
            spec["windows"], spec["steps"] = windows * steps, 1
    for item in items:
        key, _, value = item.partition("=")
        if key in ("peers", "windows", "steps", "overlap"):
            spec[key] = int(value)
        else:
            spec["set"][key] = value
    return name, spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", action="append", required=True,
                        help="name[:hparam=value,...] | ddp:LR | paper (repeatable)")
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--windows", type=int, default=12)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="", help="JSON file for the curves")
    args = parser.parse_args(argv)
    specs = dict(parse_variant(v, args.peers, args.windows, args.steps) for v in args.variant)
    runs = run_all(specs, args.workers)
    if args.out:
        write_sweep(runs, Path(args.out))
    print(sweep_table(runs))
    return 0


def sweep_table(runs: dict[str, dict]) -> str:
    """A Markdown row per variant: final and last-3 loss (nats/token, bits/byte), bytes, CPU, and the ratio to the
    best DDP run among them (if any)."""
    ddp = min((final(r["val_loss"]) for r in runs.values() if r["spec"]["kind"] == "ddp"), default=math.inf)
    f = lambda x, d=3: "—" if x is None or not math.isfinite(x) else f"{x:.{d}f}"  # noqa: E731
    lines = [f"| variant | final nats/token | bits/byte | last {TAIL} | ÷ best DDP | update bytes | CPU s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for n, r in runs.items():
        last = final(r["val_loss"])
        lines.append(f"| {n} | {f(last)} | {f(bits_of(last, r['bits_per_nat']))} | {f(tail_mean(r['val_loss']))} | "
                     f"{f(ratio(last, ddp))} | {r['update_bytes']} | {f(r.get('cpu_seconds'), 0)} |")
    return "\n".join(lines)


def write_sweep(runs: dict[str, dict], out: Path) -> None:
    """The sweep's curves as JSON at ``out``, its table beside it (``.md``) and its curves plotted (``.png``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(runs, indent=1) + "\n")
    out.with_suffix(".md").write_text(sweep_table(runs) + "\n")
    plot(runs, out.with_suffix(".png"), title="Training sweep: validation loss at equal tokens")


if __name__ == "__main__":
    sys.exit(main())
