"""Scale section: one miner on 2 ranks (FSDP2 over gloo, one thread each) against one process, and the
sharded checkpoint's stall (docs/scale.md).

* ``fsdp_rel_err`` / ``fsdp_index_agreement`` / ``fsdp_compression_exact`` — one window of inner steps from
  the same θ_0 on the same batches, on one process and on 2 ranks (``sim/scale.py``): relative L2 distance
  of the pseudo-gradients (target ≤ 1e-5), share of kept indices in common (≥ 0.999), and whether the
  sharded compression equals one process compressing the ranks' own pseudo-gradient bit for bit.
* ``miner_vs_plain_torch`` — tokens/s of the miner's inner loop (``dso.training.inner.InnerLoop``) ÷ a plain torch
  AdamW loop (zero_grad, micro-batches, clip, step) on the same model, batch and one thread (≥ 0.9);
  ``ranks_tokens_per_second`` is the 2-rank loop's, for comparison (two threads in all).
* ``rank_rss_ratio`` — the highest peak RSS of the 2 ranks ÷ one process's, each doing a miner's window
  (θ, inner steps, pseudo-gradient, error feedback, compression) in a fresh interpreter with the same
  settings: activation checkpointing on in both (the setting for models that do not fit), and a rank's
  allocator setting in both; the ``125m`` preset in full mode (target ≤ 0.65);
  ``rank_rss_ratio_no_checkpointing`` the same with checkpointing off in both; ``phase_peaks_mb`` the highest
  resident memory of each process in each part of the window (build, start, train, pseudo_gradient,
  feedback, in full mode apply — a bundle applied while the steps are kept, as in train-ahead — and
  restore: where the peak is, sim/rss.py).  Quick mode reports
  ``rank_rss_ratio_small`` at the default model, where the interpreter and torch themselves dominate.
* ``checkpoint_stall_s`` — how long a validator is blocked by a checkpoint (``CheckpointSaver``: start, then
  ``idle_s`` of the validator's own work — forward passes of its model — then the wait before it changes
  θ) on a moto S3 server on loopback, beside ``checkpoint_sync_s``, the same save made synchronously (what
  it blocked before), and ``checkpoint_save_s``, the background save's own length.

Quick mode: the default 4.3 M model, 3 inner steps, one round of the speed comparison.  Full mode: the ``25m``
preset for the equivalence, ``125m`` for memory and the checkpoint.
"""
from __future__ import annotations

import copy
import math
import statistics
import time

import torch

from benchmarks.common import preset_hparams, setup_worker, worker_pool

QUICK = {"equivalence": "tiny", "steps": 3, "speed_steps": 3, "speed_rounds": 1, "memory": "tiny", "checkpoint": "tiny",
         "idle_s": 2.0}
FULL = {"equivalence": "25m", "steps": 3, "speed_steps": 6, "speed_rounds": 3, "memory": "125m", "checkpoint": "125m",
        "idle_s": 12.0}


def run(quick: bool) -> dict:
    plan = QUICK if quick else FULL
    out: dict = {"presets": {k: v for k, v in plan.items() if k in ("equivalence", "memory", "checkpoint")}}
    out.update(equivalence(plan["equivalence"], plan["steps"]))
    out.update(speed(plan["speed_steps"], plan["speed_rounds"]))
    out["memory"] = {"checkpointing": window_memory(plan["memory"], 2, True, bundle=not quick)}
    if not quick:
        out["memory"]["no_checkpointing"] = window_memory(plan["memory"], 2, False, bundle=True)
        out["rank_rss_ratio_no_checkpointing"] = out["memory"]["no_checkpointing"]["ratio"]
    out["rank_rss_ratio_small" if quick else "rank_rss_ratio"] = out["memory"]["checkpointing"]["ratio"]
    out.update(checkpoint_stall(plan["checkpoint"], plan["idle_s"]))
    return out


def equivalence(preset: str, steps: int) -> dict:
    from sim.scale import compare
    got = compare(preset_hparams(preset), steps)
    return {"fsdp_rel_err": got["rel_err"], "fsdp_index_agreement": got["index_agreement"],
            "fsdp_compression_exact": int(got["compression_exact"]),
            "fsdp_tensors_sharded": got["sharded_tensors"], "fsdp_tensors_gathered": got["gathered_tensors"]}


# ------------------------------------------------------------------ speed
def _plain_steps(model: torch.nn.Module, hp, data: torch.Tensor, steps: int) -> float:
    """A plain torch AdamW loop, as a tutorial writes it: seconds for ``steps`` steps."""
    opt = torch.optim.AdamW(model.parameters(), lr=hp.inner.lr, betas=(hp.inner.beta1, hp.inner.beta2),
                            eps=hp.inner.eps, weight_decay=hp.inner.weight_decay)
    started = time.perf_counter()
    for s in range(steps):
        batch = data[s * hp.batch_size:(s + 1) * hp.batch_size]
        opt.zero_grad(set_to_none=True)
        for i in range(0, batch.shape[0], hp.micro_batch):
            part = batch[i:i + hp.micro_batch]
            (model.loss(part) * (part.shape[0] / batch.shape[0])).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), hp.inner.clip_norm)
        opt.step()
    return time.perf_counter() - started


def _miner_steps(model: torch.nn.Module, hp, data: torch.Tensor, steps: int) -> float:
    from dso.training.inner import InnerLoop
    loop = InnerLoop(model, hp)
    loop.start(None)
    started = time.perf_counter()
    loop.train(0, data, max_steps=steps, deadline=math.inf, clock=time.time)
    return time.perf_counter() - started


def speed(steps: int, rounds: int) -> dict:
    """Tokens/s of the miner's loop and of the plain loop, alternated ``rounds`` times (medians)."""
    from dso.config.schema import HParams
    from dso.nn.model import build_model
    from sim.ranks import run_ranks
    from sim.scale import batches, on_ranks

    hp = HParams()
    data = batches(hp, steps + 1, seed=3)
    tokens = steps * hp.batch_size * hp.model.seq_len
    miner, plain = [], []
    for _ in range(rounds):
        for runner, into in ((_miner_steps, miner), (_plain_steps, plain)):
            model = build_model(hp.model, hp.seed)
            runner(model, hp, data[:hp.batch_size], 1)  # warm-up: allocator, kernels
            into.append(tokens / runner(model, hp, data[hp.batch_size:], steps))
    ranked = run_ranks(on_ranks, 2, copy.deepcopy(hp), data[hp.batch_size:], steps)[0]
    return {"miner_tokens_per_second": statistics.median(miner), "plain_tokens_per_second": statistics.median(plain),
            "miner_vs_plain_torch": statistics.median(miner) / statistics.median(plain),
            "ranks_tokens_per_second": tokens / ranked["seconds"], "speed_steps": steps}


# ----------------------------------------------------------------- memory
def window_memory(preset: str, steps: int, checkpointing: bool, bundle: bool = False) -> dict:
    """Peak RSS of one process and of each of 2 ranks doing a miner's window, with the same settings (activation
    checkpointing on or off in both; both with a rank's allocator setting,
    dso.distributed.ranks.return_freed_tensors); ``bundle``: with a bundle applied as in train-ahead."""
    from sim.ranks import run_ranks
    from sim.scale import window_memory_one, window_memory_ranks

    hp = preset_hparams(preset)
    with worker_pool(1) as pool:
        one = pool.submit(window_memory_one, hp, steps, checkpointing, bundle).result()
    ranks = run_ranks(window_memory_ranks, 2, hp, steps, checkpointing, bundle, timeout=3600)
    peaks = [r["peak_rss_mb"] for r in ranks]
    return {"preset": preset, "steps": steps, "activation_checkpointing": checkpointing,
            "one_process_mb": one["peak_rss_mb"], "rank_mb": peaks,
            "ratio": max(peaks) / one["peak_rss_mb"], "mean_ratio": statistics.mean(peaks) / one["peak_rss_mb"],
            "interpreter_mb": one["rss_before_mb"], "one_train_seconds": one["train_seconds"],
            "ranks_train_seconds": max(r["train_seconds"] for r in ranks), "bundle": bundle,
            "phase_peaks_mb": {"one_process": one["phase_peaks_mb"], "ranks": [r["phase_peaks_mb"] for r in ranks]}}


# ------------------------------------------------------------- checkpoint
def checkpoint_stall(preset: str, idle_s: float) -> dict:
    with worker_pool(1) as pool:  # its own process: the 125m model and the S3 server's memory go with it
        return pool.submit(_checkpoint_stall, preset, idle_s).result()


def _checkpoint_stall(preset: str, idle_s: float) -> dict:
    from dso.nn.model import build_model, parameter_shapes
    from dso.training.outer import OuterState
    from dso.training.train import evaluate
    from sim.scale import batches
    from storage.checkpoint import CheckpointSaver, save_checkpoint
    from storage.server import EmbeddedS3

    setup_worker()
    hp = preset_hparams(preset)
    model = build_model(hp.model, hp.seed)
    outer = OuterState.fresh(parameter_shapes(model), hp)
    batch = batches(hp, 1)[:hp.micro_batch]
    server = EmbeddedS3.start()
    try:
        peer = server.provision("bench")
        client = peer.write_client()
        started = time.perf_counter()
        save_checkpoint(client, peer.bucket, model, 1, hp, "", outer)
        sync_s = time.perf_counter() - started
        saver = CheckpointSaver(client, peer.bucket)
        started = time.perf_counter()
        saver.start(model, 2, hp, "", outer)
        start_s = time.perf_counter() - started
        worked, passes = time.perf_counter(), 0
        while time.perf_counter() - worked < idle_s:  # the validator's own work while the upload runs
            evaluate(model, batch, hp.micro_batch)
            passes += 1
        saver.wait()
    finally:
        server.stop()
    size = sum(4 * p.numel() for p in model.parameters())
    return {"checkpoint_stall_s": start_s + saver.stalls[-1], "checkpoint_sync_s": sync_s,
            "checkpoint_save_s": saver.seconds[-1], "checkpoint_mb": size / 2 ** 20, "checkpoint_idle_s": idle_s,
            "checkpoint_idle_passes": passes, "checkpoint_preset": preset}
