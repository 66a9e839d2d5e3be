"""The miner's window on N ranks against one process: the experiment behind the equivalence tests and
``scripts/bench.py``'s ``scale`` section.

From the same θ_0 and the same assigned batches, one process runs the miner's inner loop
(dso.training.inner.InnerLoop) and error feedback (dso.codec.demo.ErrorFeedback); N ranks run the sharded ones
(dso.distributed.sharded_inner, dso.distributed.sharded_codec) as a torchrun miner does.  Compared: the
pseudo-gradients (relative
L2 distance), the compressed updates (share of kept indices in common), and the sharded compression
against one process compressing the very pseudo-gradient the ranks produced (bit for bit).
"""
from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dso.codec.codecs import Codec, make_codec
from dso.codec.demo import ErrorFeedback, TensorUpdate
from dso.config.schema import HParams
from dso.distributed.fsdp import shapes_of
from dso.distributed.sliced_theta import SlicedTheta
from dso.nn.model import build_model, initial_tensors, parameter_shapes, tensor_count
from dso.training.inner import InnerLoop
from neurons.theta import Theta, WholeTheta
from sim.rss import PhasePeaks

if TYPE_CHECKING:
    from dso.distributed.ranks import Ranks
    from dso.distributed.sharded_inner import ShardedInnerLoop


def relative_l2(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """‖a − b‖ / ‖b‖ over every tensor (float64)."""
    num = sum(float(np.sum((np.asarray(a[n], np.float64) - np.asarray(b[n], np.float64)) ** 2)) for n in b)
    den = sum(float(np.sum(np.asarray(b[n], np.float64) ** 2)) for n in b)
    return math.sqrt(num / den) if den else math.sqrt(num)


def index_agreement(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """Share of the kept values whose index (within its chunk) both updates keep: Σ |rows' common indices| /
    Σ kept.  ``a``/``b``: parameter name → indices (n_chunks × k)."""
    common = kept = 0
    for name, idx_b in b.items():
        x, y = torch.as_tensor(np.asarray(a[name])), torch.as_tensor(np.asarray(idx_b))
        common += int((x.unsqueeze(-1) == y.unsqueeze(-2)).any(-1).sum())
        kept += y.numel()
    return common / kept if kept else 1.0


def batches(hp: HParams, steps: int, seed: int = 0) -> torch.Tensor:
    """``steps`` steps' worth of random token sequences (the assignment's shape, reproducible)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, hp.model.vocab_size, (steps * hp.batch_size, hp.model.seq_len + 1), generator=gen)


def as_arrays(update: Mapping[str, TensorUpdate]) -> dict[str, dict[str, np.ndarray]]:
    return {n: {"idx": u.idx.numpy().copy(), "codes": u.codes.numpy().copy(), "scale": u.scale.numpy().copy()}
            for n, u in update.items()}


def one_process(hp: HParams, data: torch.Tensor, steps: int, uid: int = 1) -> dict[str, Any]:
    """The miner's inner loop and compression of one window in this process."""
    model = build_model(hp.model, hp.seed)
    loop = InnerLoop(model, hp)
    codec = make_codec(parameter_shapes(model), hp)
    loop.start(None)
    started = time.perf_counter()
    report = loop.train(0, data, max_steps=steps)
    seconds = time.perf_counter() - started
    grads = loop.pseudo_gradient()
    update = ErrorFeedback(codec, hp.ef_beta).step(grads, 0, uid)
    return {"pseudo_gradient": {n: g.numpy().copy() for n, g in grads.items()}, "update": as_arrays(update),
            "seconds": seconds, "sequences": report.sequences, "losses": report.losses}


def on_ranks(hp: HParams, data: torch.Tensor, steps: int, uid: int = 1) -> dict[str, Any] | None:
    """The same window on this rank of a torchrun-style group (call on every rank; the leader's result)."""
    from dso.distributed.fsdp import codec_shard_dims
    from dso.distributed.ranks import join_group
    from dso.distributed.sharded_codec import ShardedFeedback

    ranks = join_group("cpu")
    codec = make_codec(shapes_of(hp.model), hp)
    dims = codec_shard_dims(codec, ranks.world)
    loop = ranked_loop(hp, ranks, dims)
    loop.start(None)
    started = time.perf_counter()
    report = loop.train(0, data, max_steps=steps)
    seconds = time.perf_counter() - started
    slices = loop.pseudo_gradient()
    feedback = ShardedFeedback(codec, hp.ef_beta, ranks, dims)
    update = feedback.step(slices, 0, uid)
    whole = {n: loop.gather_full(n, s) for n, s in slices.items()}
    if not ranks.leader:
        return None
    assert update is not None
    return {"pseudo_gradient": {n: g.numpy().copy() for n, g in whole.items() if g is not None},
            "update": as_arrays(update), "seconds": seconds, "sequences": report.sequences,
            "losses": report.losses, "sharded": sorted(feedback.parts), "gathered": feedback.gathered}


def ranked_loop(hp: HParams, ranks: Ranks, dims: Mapping[str, int],
                activation_checkpointing: bool = False) -> ShardedInnerLoop:
    """The sharded inner loop on this rank with θ_0 in its anchor slices, streamed from the leader a tensor at a
    time, as a torchrun miner starts (neurons/miner_ranks.py): no rank builds the whole θ (call on every rank)."""
    from dso.distributed.fsdp import sharded_model
    from dso.distributed.sharded_inner import ShardedInnerLoop

    loop = ShardedInnerLoop(sharded_model(hp.model, ranks, dims, activation_checkpointing), hp, ranks, dims)
    theta = SlicedTheta(loop.anchor, shapes_of(hp.model), dims, ranks, hp)
    theta.load(initial_tensors(hp.model, hp.seed) if ranks.leader else ())
    return loop


def compare(hp: HParams, steps: int, world: int = 2, seed: int = 0) -> dict[str, Any]:
    """One window on one process and on ``world`` ranks, from the same θ_0 and batches."""
    from sim.ranks import run_ranks

    hp = copy.deepcopy(hp)
    data = batches(hp, steps, seed)
    single = one_process(hp, data, steps)
    ranked = run_ranks(on_ranks, world, hp, data, steps)[0]
    codec = make_codec(shapes_of(hp.model), hp)
    # one process compressing the very pseudo-gradient the ranks produced: the sharded compression must match
    again = ErrorFeedback(codec, hp.ef_beta).step({n: torch.from_numpy(g) for n, g in
                                                   ranked["pseudo_gradient"].items()}, 0, 1)
    exact = all(np.array_equal(u.idx.numpy(), ranked["update"][n]["idx"])
                and np.array_equal(u.codes.numpy(), ranked["update"][n]["codes"])
                and np.array_equal(u.scale.numpy(), ranked["update"][n]["scale"]) for n, u in again.items())
    return {"rel_err": relative_l2(ranked["pseudo_gradient"], single["pseudo_gradient"]),
            "index_agreement": index_agreement({n: u["idx"] for n, u in ranked["update"].items()},
                                               {n: u["idx"] for n, u in single["update"].items()}),
            "compression_exact": exact, "sharded_tensors": len(ranked["sharded"]),
            "gathered_tensors": len(ranked["gathered"]), "tensors": tensor_count(hp.model),
            "losses_single": single["losses"], "losses_ranks": ranked["losses"],
            "seconds_single": single["seconds"], "seconds_ranks": ranked["seconds"]}


def peak_rss_mb() -> float:
    """This process's peak resident set so far (VmHWM), in MB."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def window_memory_one(hp: HParams, steps: int, activation_checkpointing: bool = False,
                      bundle: bool = False) -> dict[str, Any]:
    """Peak RSS of one process doing a miner's window: θ, ``steps`` inner steps, pseudo-gradient, error
    feedback and compression, and with ``bundle`` a bundle applied while the steps are kept, as in train-ahead
    (call in a fresh process)."""
    from dso.distributed.ranks import return_freed_tensors
    torch.set_num_threads(1)
    return_freed_tensors()  # the same allocator settings as a rank's (dso/distributed/ranks.py)
    before = peak_rss_mb()
    with PhasePeaks("build") as peaks:
        model = build_model(hp.model, hp.seed)
        model.activation_checkpointing = activation_checkpointing
        loop = InnerLoop(model, hp)
        feedback = ErrorFeedback(make_codec(parameter_shapes(model), hp), hp.ef_beta)
        seconds = _window(peaks, loop, feedback, hp, steps, WholeTheta(model) if bundle else None)
    return {"peak_rss_mb": peak_rss_mb(), "rss_before_mb": before, "train_seconds": seconds,
            "phase_peaks_mb": peaks.peaks_mb}


def _window(peaks: PhasePeaks, loop: InnerLoop, feedback: Any, hp: HParams, steps: int,
            theta: Theta | None = None) -> float:
    """A miner's window after the build, each part its own phase of ``peaks`` (``feedback``: an ErrorFeedback or
    a ShardedFeedback; ``theta``: the node's θ, to apply a bundle of the window's own update to, if given): the
    training's seconds."""
    peaks.phase("start")
    loop.start(None)
    peaks.phase("train")
    started = time.perf_counter()
    loop.train(0, batches(hp, steps), max_steps=steps)
    seconds = time.perf_counter() - started
    peaks.phase("pseudo_gradient")
    grads = loop.pseudo_gradient()
    peaks.phase("feedback")
    update = feedback.step(grads, 0, 1)
    del grads
    if theta is not None:
        peaks.phase("apply")
        apply_own_bundle(loop, theta, hp, feedback.codec, update)
    peaks.phase("restore")
    loop.restore_anchor()
    return seconds


BUNDLE_PEERS = 3  # the window's own update under this many uids: a bundle's decode does not grow with its peers


def apply_own_bundle(loop: Any, theta: Theta, hp: HParams, codec: Codec, update: Any) -> None:
    """A bundle landing during train-ahead, as neurons/miner.py applies it: keep the steps taken, θ_t back into
    the model, the window's outer step (the update under BUNDLE_PEERS uids; the leader's, None elsewhere)
    with θ hashed before and after, the steps rebased onto θ_{t+1}.  On ranks every rank calls it."""
    from dso.protocol.payload import Payload, PayloadMeta
    from dso.training.outer import OuterState
    from neurons.engine import aggregate_window

    local = loop.local_weights()
    loop.restore_anchor()
    if update is None:  # not the leader: take part in what the leader announces (neurons/ranks.py)
        assert isinstance(theta, SlicedTheta)
        for op, args in (("hash", {}), ("step", {"window": 0}), ("hash", {})):
            theta.handle(op, args)
    else:
        payloads = {uid: Payload(PayloadMeta(uid, 0, hp.protocol_version, hp.digest()), update,
                                 torch.zeros(0), 0) for uid in range(1, BUNDLE_PEERS + 1)}
        aggregate_window(theta, codec, hp, 0, payloads, list(payloads), OuterState.fresh(codec.shapes, hp))
    loop.rebase_local(local)


def window_memory_ranks(hp: HParams, steps: int, activation_checkpointing: bool = False,
                        bundle: bool = False) -> dict[str, Any]:
    """The same window on this rank of a group (call on every rank): each rank's peak RSS."""
    from dso.distributed.fsdp import codec_shard_dims
    from dso.distributed.ranks import join_group, return_freed_tensors
    from dso.distributed.sharded_codec import ShardedFeedback

    return_freed_tensors()
    before = peak_rss_mb()
    with PhasePeaks("build") as peaks:
        ranks = join_group("cpu")
        codec = make_codec(shapes_of(hp.model), hp)
        dims = codec_shard_dims(codec, ranks.world)
        loop = ranked_loop(hp, ranks, dims, activation_checkpointing)  # θ_0 streamed into the anchor slices
        theta = SlicedTheta(loop.anchor, codec.shapes, dims, ranks, hp) if bundle else None
        seconds = _window(peaks, loop, ShardedFeedback(codec, hp.ef_beta, ranks, dims), hp, steps, theta)
    return {"peak_rss_mb": peak_rss_mb(), "rss_before_mb": before, "train_seconds": seconds, "rank": ranks.rank,
            "phase_peaks_mb": peaks.peaks_mb}


def throughput_ranks(hp: HParams, steps: int, device: str = "cuda") -> dict[str, Any] | None:
    """Tokens/s of the sharded inner loop on this rank's device (call on every rank; the leader's result):
    one warm-up step, then ``steps`` timed steps of the run's batch."""
    from dso.distributed.fsdp import codec_shard_dims
    from dso.distributed.ranks import join_group

    ranks = join_group(device)
    dims = codec_shard_dims(make_codec(shapes_of(hp.model), hp), ranks.world)
    loop = ranked_loop(hp, ranks, dims)
    loop.start(None)
    data = batches(hp, steps + 1)
    loop.train(0, data[:hp.batch_size], max_steps=1)
    if ranks.device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    report = loop.train(0, data[hp.batch_size:], max_steps=steps)
    if ranks.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if ranks.device.type == "cuda" else float("nan")
    if not ranks.leader:
        return None
    return {"tokens_per_second": report.sequences * hp.model.seq_len / seconds, "ranks": ranks.world,
            "peak_gpu_memory_gb": peak}


def forward_backward_memory(hp: HParams, activation_checkpointing: bool) -> dict[str, Any]:
    """What fits where a whole window does not: the model built, then one micro-batch's forward and backward
    (peak RSS in MB after each, in a fresh process) — the parts of a miner's memory a formula cannot know."""
    from dso.distributed.ranks import return_freed_tensors
    torch.set_num_threads(1)
    return_freed_tensors()
    out: dict[str, Any] = {"interpreter_mb": peak_rss_mb()}
    model = build_model(hp.model, hp.seed)
    model.activation_checkpointing = activation_checkpointing
    out["model_mb"] = peak_rss_mb()
    started = time.perf_counter()
    (model.loss(batches(hp, 1)[:hp.micro_batch])).backward()  # type: ignore[no-untyped-call]
    out.update(forward_backward_mb=peak_rss_mb(), seconds=time.perf_counter() - started,
               parameters=sum(p.numel() for p in model.parameters()), micro_batch=hp.micro_batch,
               seq_len=hp.model.seq_len, activation_checkpointing=activation_checkpointing)
    return out
