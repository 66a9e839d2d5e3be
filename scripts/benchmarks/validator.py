"""Validator section: evaluation cost per peer in forward-pass units, and peak memory of validator and miner.

Cost: the real :func:`scoring.window.score_window` on honest updates (one error-feedback step of
DeMo on each peer's real gradient, in sync with the validator), timed with |S_t| = S and with
|S_t| = 1 on the same payloads.  Everything but the per-peer evaluation is identical in the two
calls (fast checks of all peers, L(θ_t, D_rand), the parameter snapshot, rating, weights), so

    per_peer = (T(S) − T(1)) / (S − 1),   shared = T(1) − per_peer,
    eval_forward_units_per_peer = (T(S) − shared) / S / T_fwd = per_peer / T_fwd,

with T_fwd one :func:`dso.training.train.evaluate` on ``eval_sequences`` sequences.  The per-peer work is: decode of the
update, its evaluation step, forwards over its sample of trained sequences at θ' and at the consensus step and over
the random sequences at θ', restoring θ_t after each step (``sequences_per_peer`` counts the sequences).

Times are CPU times of the measuring process (one torch thread), so competing processes barely
move the ratio; the wall-time ratio is reported next to it.

Memory: each measurement runs in a fresh process, so its VmHWM is that role's own peak.  In
full mode a small local network (real processes, S3, chain) also reports each process's VmHWM.
"""
from __future__ import annotations

import statistics

from benchmarks.common import median_times, own_peak_rss_mb, worker_pool

DECLARED_STEPS = 9  # inner steps a miner of the default local network takes in a window

WINDOW = 10  # past the warm-up: α_t is the full learning rate
RANDOMNESS = bytes(range(32))


def per_peer_cost(t_many: float, t_one: float, many: int) -> tuple[float, float]:
    """(per-peer time, shared time) from score times with ``many`` and with one evaluated peer."""
    if many < 2:
        raise ValueError("need at least two evaluated peers to separate shared from per-peer work")
    per_peer = (t_many - t_one) / (many - 1)
    return per_peer, t_one - per_peer


def _honest_payloads(model, codec, dataset, hp, uids, positions, sequences: int | None = None) -> dict:
    from dso.codec.demo import ErrorFeedback
    from dso.protocol.payload import Payload, PayloadMeta
    from dso.training.train import compute_gradients
    from scoring.sync import sample_parameters

    sync = sample_parameters(dict(model.named_parameters()), positions)
    payloads = {}
    for uid in uids:
        batch = dataset.training_batch(uid, WINDOW, hp.assigned_sequences, sequences or hp.batch_size)
        grads, _ = compute_gradients(model, batch, hp.micro_batch)
        # each payload declares what a miner of the default local network gets through (9 inner steps of a batch):
        # the proof of computation's sample, and so the cost measured, follows the declaration
        meta = PayloadMeta(uid, WINDOW, hp.protocol_version, hp.digest(),
                           trained=min(DECLARED_STEPS * hp.batch_size, hp.assigned_sequences))
        payloads[uid] = Payload(meta, ErrorFeedback(codec, hp.ef_beta).step(grads, 0, uid), sync.clone(), 0)
        del grads
    return payloads


def measure_eval_cost(quick: bool, eval_sequences: int | None = None, repeats: int | None = None,
                      peers: int | None = None, preset: str = "", gradient_sequences: int | None = None) -> dict:
    """Runs in its own process (see module doc); returns timings in ms and this process's peak RSS.

    ``preset``: a named model shape (dso.nn.presets) built for real instead of the default model;
    ``gradient_sequences``: sequences behind each honest payload (the payload's size does not depend
    on it, only the time to make it)."""
    import copy

    from benchmarks.common import default_dataset, preset_hparams, setup_worker
    setup_worker()
    from dso.codec.demo import DeMoCodec
    from dso.config.schema import HParams
    from dso.nn.model import build_model, parameter_shapes, sync_sample_count
    from scoring.evaluation import update_step
    from scoring.state import ValidatorState
    from scoring.sync import sync_positions
    from scoring.window import Scorer, WindowEvidence, score_window

    hp = preset_hparams(preset) if preset else HParams()
    hp.eval_sequences = eval_sequences or hp.eval_sequences
    hp.eval_peers = peers or hp.eval_peers
    model = build_model(hp.model, hp.seed)
    shapes = parameter_shapes(model)
    codec = DeMoCodec.from_hparams(shapes, hp)
    dataset = default_dataset(hp)
    many = hp.eval_peers
    uids = list(range(many))
    positions = sync_positions(RANDOMNESS, shapes, sync_sample_count(hp))
    payloads = _honest_payloads(model, codec, dataset, hp, uids, positions, gradient_sequences)
    repeats = repeats or (3 if quick else 9)

    # the consensus step the proof of computation compares with: any step of the right size (one peer's, halved)
    reference = {n: 1.0 for n in shapes}
    control = {n: 0.5 * t for n, t in update_step(codec, payloads[0].update, hp, WINDOW, reference, shapes).items()}

    def score(eval_peers: int):
        hp_s = copy.deepcopy(hp)
        hp_s.eval_peers = eval_peers
        state = ValidatorState.new(hp.digest(), secret="00" * 16)
        evidence = WindowEvidence(WINDOW, payloads, {}, uids, RANDOMNESS, RANDOMNESS, control=control)
        return score_window(state, Scorer(model, codec, dataset, hp_s), evidence)

    report = score(many)
    if sorted(report.evaluated) != uids:  # every honest peer must pass and be evaluated, or the timing is wrong
        raise RuntimeError(f"bench validator: evaluated {report.evaluated}, rejections {report.rejections}")
    steps, poc_sequences = _peer_steps(model, codec, dataset, hp, payloads[0], reference, shapes, control)
    steps = {"many": lambda: score(many), "one": lambda: score(1), **steps}
    wall, cpu = _interleaved_medians(steps, {"forward": 3, "decode_sign": 3}, repeats)
    return {"preset": preset or "default", "parameters": sum(p.numel() for p in model.parameters()),
            "repeats": repeats} | _eval_cost_figures(wall, cpu, many, poc_sequences, hp.eval_sequences)


def _peer_steps(model, codec, dataset, hp, payload, reference: dict, shapes: dict, control: dict
                ) -> tuple[dict, int]:
    """The steps score_window takes for one evaluated peer, one by one with the very functions it calls, and a
    forward pass over the random batch (the unit); the number of proof-of-computation sequences."""
    import numpy as np

    from dso.training.train import evaluate
    from scoring.evaluation import ParameterSnapshot, evaluate_peer, random_losses, update_step
    from scoring.window import poc_sample_size

    rand = dataset.unassigned(np.random.default_rng(0), np.array([], dtype=np.int64), hp.eval_sequences)
    assigned = dataset.assigned(0, WINDOW, hp.assigned_sequences)[:poc_sample_size(hp, payload.meta.trained)]
    snapshot = ParameterSnapshot(model)
    random = random_losses(model, snapshot, control, rand, hp.micro_batch)
    step = update_step(codec, payload.update, hp, WINDOW, reference, shapes)
    return {
        "forward": lambda: evaluate(model, rand, hp.micro_batch),
        "decode_sign": lambda: update_step(codec, payload.update, hp, WINDOW, reference, shapes),
        "peer_eval": lambda: evaluate_peer(model, snapshot, step, control, assigned, random, hp.micro_batch),
    }, len(assigned)


def _interleaved_medians(steps: dict, calls: dict[str, int], repeats: int) -> tuple[dict, dict]:
    """(wall, cpu) ms per step: the median over ``repeats`` interleaved rounds (load from other processes hits every
    step alike), ``calls[name]`` calls per round for the short steps."""
    wall: dict[str, list[float]] = {name: [] for name in steps}
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, fn in steps.items():
            w, c = median_times(fn, calls.get(name, 1), warmup=0)
            wall[name].append(w)
            cpu[name].append(c)
    return ({name: statistics.median(v) for name, v in wall.items()},
            {name: statistics.median(v) for name, v in cpu.items()})


def _eval_cost_figures(wall: dict, cpu: dict, many: int, poc_sequences: int, eval_sequences: int) -> dict:
    per_peer, shared = per_peer_cost(cpu["many"], cpu["one"], many)
    per_peer_wall, _ = per_peer_cost(wall["many"], wall["one"], many)
    return {
        "evaluated_peers": many, "eval_sequences": eval_sequences,
        "eval_forward_units_per_peer": per_peer / cpu["forward"],
        "eval_forward_units_per_peer_wall": per_peer_wall / wall["forward"],
        "score_window_cpu_ms": cpu["many"], "score_window_one_peer_cpu_ms": cpu["one"],
        "per_peer_cpu_ms": per_peer, "shared_cpu_ms": shared, "forward_cpu_ms": cpu["forward"],
        "score_window_ms": wall["many"], "forward_ms": wall["forward"],
        "poc_sequences": poc_sequences, "sequences_per_peer": 2 * poc_sequences + eval_sequences,
        "breakdown_cpu_ms": {"decode_and_step": cpu["decode_sign"], "forwards_apply_restore": cpu["peer_eval"]},
        "breakdown_forward_units": (cpu["decode_sign"] + cpu["peer_eval"]) / cpu["forward"],
        "inprocess_peak_rss_mb": own_peak_rss_mb(),
    }


def measure_miner_footprint() -> dict:
    """Runs in its own process: one window of miner work (gradient, error feedback, wire payload)."""
    from benchmarks.common import default_dataset, setup_worker
    setup_worker()
    import torch

    from dso.codec.demo import DeMoCodec, ErrorFeedback
    from dso.config.schema import HParams
    from dso.nn.model import build_model, parameter_shapes, sync_sample_count
    from dso.protocol.payload import PayloadMeta
    from dso.training.train import compute_gradients
    from storage.wire import encode_payload

    hp = HParams()
    model = build_model(hp.model, hp.seed)
    codec = DeMoCodec.from_hparams(parameter_shapes(model), hp)
    feedback = ErrorFeedback(codec, hp.ef_beta)
    dataset = default_dataset(hp)
    grads, _ = compute_gradients(model, dataset.assigned(0, 0, hp.batch_size), hp.micro_batch)
    update = feedback.step(grads, 0)
    blob = encode_payload(codec, update, torch.zeros(sync_sample_count(hp)), PayloadMeta(0, 0, hp.protocol_version,
                                                                                     hp.digest()))
    return {"inprocess_peak_rss_mb": own_peak_rss_mb(), "payload_bytes": len(blob)}


def run(quick: bool) -> dict:
    with worker_pool(1) as pool:  # quick: a smoke run of the same code, two peers, one round
        cost = pool.submit(measure_eval_cost, quick, None, 1 if quick else None, 2 if quick else None).result()
    if not quick:  # what the fixed per-peer work (decode, apply, restore) weighs against a 4x larger batch
        with worker_pool(1) as pool:
            big = pool.submit(measure_eval_cost, quick, 4 * cost["eval_sequences"], 3, 2).result()
        cost["larger_eval_batch"] = {k: big[k] for k in ("eval_sequences", "evaluated_peers",
                                                          "eval_forward_units_per_peer", "per_peer_cpu_ms",
                                                          "forward_cpu_ms", "breakdown_cpu_ms")}
    with worker_pool(1) as pool:
        miner = pool.submit(measure_miner_footprint).result()
    if not quick:
        with worker_pool(1) as pool:  # the ~125 M preset built for real: two peers
            cost["model_125m"] = pool.submit(measure_eval_cost, quick, None, 2, 2, "125m", 1).result()
    out = {"eval_forward_units_per_peer": cost.pop("eval_forward_units_per_peer"), **cost}
    out["miner_inprocess_peak_rss_mb"] = miner["inprocess_peak_rss_mb"]
    if quick:
        out["peak_rss_mb"], out["miner_peak_rss_mb"] = out["inprocess_peak_rss_mb"], miner["inprocess_peak_rss_mb"]
        out["peak_rss_source"] = "in-process (benchmark worker doing the role's work)"
        return out
    from benchmarks.localnet_rss import localnet_peaks
    net = localnet_peaks(miners=3, windows=3)
    out["localnet"] = net
    out["peak_rss_mb"] = net.get("validator_peak_rss_mb") or out["inprocess_peak_rss_mb"]
    out["miner_peak_rss_mb"] = net.get("miner_peak_rss_mb") or miner["inprocess_peak_rss_mb"]
    out["peak_rss_source"] = ("local network processes (VmHWM)" if net.get("validator_peak_rss_mb")
                              else "in-process (the local network did not report)")
    return out


def markdown(result: dict) -> str:
    b = result["breakdown_cpu_ms"]
    lines = ["| metric | value |", "|---|---:|",
             f"| eval_forward_units_per_peer (CPU time; target ≤ 4) | {result['eval_forward_units_per_peer']:.2f} |",
             f"| sequences forwarded per evaluated peer | {result.get('sequences_per_peer', '—')} |",
             f"| the same from wall time | {result['eval_forward_units_per_peer_wall']:.2f} |",
             f"| per-peer / shared / forward CPU ms ({result['evaluated_peers']} peers, {result['eval_sequences']} "
             f"sequences) | {result['per_peer_cpu_ms']:.1f} / {result['shared_cpu_ms']:.1f} / "
             f"{result['forward_cpu_ms']:.1f} |",
             f"| decode + step, forwards + apply + restore CPU ms | {b['decode_and_step']:.1f}, "
             f"{b['forwards_apply_restore']:.1f} |",
             f"| peak RSS validator / miner MB ({result['peak_rss_source']}) | {result['peak_rss_mb']:.0f} / "
             f"{result['miner_peak_rss_mb']:.0f} |"]
    m = result.get("model_125m")
    if m:
        lines.append(f"| ~125 M preset ({m['parameters'] / 1e6:.0f} M parameters, {m['eval_sequences']} sequences): "
                     f"forward units per peer, per-peer / forward CPU ms, peak RSS MB | "
                     f"{m['eval_forward_units_per_peer']:.2f}, {m['per_peer_cpu_ms']:.0f} / {m['forward_cpu_ms']:.0f}, "
                     f"{m['inprocess_peak_rss_mb']:.0f} |")
    big = result.get("larger_eval_batch")
    if big:
        lines.append(f"| eval_forward_units_per_peer with {big['eval_sequences']} eval sequences | "
                     f"{big['eval_forward_units_per_peer']:.2f} |")
    net = result.get("localnet")
    if net and "error" in net:
        lines.append(f"| local network | {net['error']} |")
    return "\n".join(lines)
