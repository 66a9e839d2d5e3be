"""Codec section: encode/decode time, bytes per kept coefficient against the bound, ratio to fp32."""
from __future__ import annotations

import math
import time

import torch

from benchmarks.common import default_dataset, median_times, worker_pool
from dso.codec.demo import DeMoCodec
from dso.config.schema import HParams, ModelConfig
from dso.nn.model import build_model, parameter_shapes
from dso.training.train import compute_gradients

TEMPLAR_BYTES_PER_KEPT = 2.5  # 12-bit index + 1-byte value


def shapes_100m() -> dict[str, tuple[int, ...]]:
    """LLaMA-style tensor shapes of ~109 M parameters (GPT-2 vocabulary, which needs padding to chunk)."""
    cfg = ModelConfig(vocab_size=50257, d_model=768, n_layers=10, n_heads=12, ffn_hidden=2048)
    shapes = {"embed.weight": (cfg.vocab_size, cfg.d_model), "norm.weight": (cfg.d_model,)}
    for i in range(cfg.n_layers):
        for w in ("wq", "wk", "wv", "wo"):
            shapes[f"blocks.{i}.attn.{w}.weight"] = (cfg.d_model, cfg.d_model)
        shapes[f"blocks.{i}.ffn.w_gate.weight"] = (cfg.ffn_hidden, cfg.d_model)
        shapes[f"blocks.{i}.ffn.w_up.weight"] = (cfg.ffn_hidden, cfg.d_model)
        shapes[f"blocks.{i}.ffn.w_down.weight"] = (cfg.d_model, cfg.ffn_hidden)
        shapes[f"blocks.{i}.attn_norm.weight"] = (cfg.d_model,)
        shapes[f"blocks.{i}.ffn_norm.weight"] = (cfg.d_model,)
    return shapes


def measure(codec: DeMoCodec, tensors: dict[str, torch.Tensor], repeats: int) -> dict:
    numel = sum(math.prod(s) for s in codec.shapes.values())
    payload = codec.payload_bytes()
    out = {
        "parameters": numel,
        "kept": codec.kept(),
        "payload_bytes": payload,
        "bytes_per_kept": payload / codec.kept(),
        "bound_bytes_per_kept": codec.bound_bytes_per_kept(),
        "ratio_vs_fp32": 4 * numel / payload,
    }
    out["within_bound_pct"] = 100 * (out["bytes_per_kept"] / out["bound_bytes_per_kept"] - 1)
    out["vs_templar_2_5_bytes"] = TEMPLAR_BYTES_PER_KEPT / out["bytes_per_kept"]
    if repeats:
        wire = codec.to_wire(codec.compress(tensors, 0))
        encode = lambda: codec.to_wire(codec.compress(tensors, 0))  # noqa: E731
        decode = lambda: codec.decompress(codec.from_wire(wire, 0))  # noqa: E731
        out["encode_ms"], out["encode_cpu_ms"] = median_times(encode, repeats)
        out["decode_ms"], out["decode_cpu_ms"] = median_times(decode, repeats)
    return out


def compression_share(encode_ms: float, decode_ms: float, gradient_ms: float) -> float:
    """Share of a miner's window compute spent in the codec: (encode + decode) / (gradient + encode + decode).

    Fed with CPU times (one torch thread), so load from other processes does not move it."""
    return (encode_ms + decode_ms) / (gradient_ms + encode_ms + decode_ms)


def run(quick: bool) -> dict:
    hp = HParams()
    model = build_model(hp.model, hp.seed)
    codec = DeMoCodec.from_hparams(parameter_shapes(model), hp)
    ds = default_dataset(hp)
    batch = ds.training_batch(0, 0, hp.assigned_sequences, hp.batch_size)
    grads, _ = compute_gradients(model, batch, hp.micro_batch)
    result = measure(codec, grads, repeats=3 if quick else 9)
    result["miner_gradient_ms"], result["miner_gradient_cpu_ms"] = median_times(
        lambda: compute_gradients(model, batch, hp.micro_batch), 2 if quick else 5)
    result["compression_share_of_window"] = compression_share(
        result["encode_cpu_ms"], result["decode_cpu_ms"], result["miner_gradient_cpu_ms"])

    big = DeMoCodec(shapes_100m(), chunk=hp.chunk, topk=hp.topk, value_bits=hp.value_bits)
    big_tensors = {n: torch.randn(s) for n, s in big.shapes.items()} if not quick else {}
    result["model_100m"] = measure(big, big_tensors, repeats=0 if quick else 1)
    with worker_pool(1) as pool:  # its own process: a clean peak RSS, and its memory is returned after
        result["model_125m"] = pool.submit(measure_preset, "125m", quick).result()
    return result


def measure_preset(preset: str, quick: bool) -> dict:
    """The codec on a real model of a named preset: built for real, a real gradient, encode and decode.

    The gradient is taken on ``micro_batch`` sequences (one in quick mode); the share of a miner's
    compute spent in the codec scales its time linearly to a baseline batch of ``batch_size``."""
    from benchmarks.common import own_peak_rss_mb, preset_hparams, setup_worker
    setup_worker()
    hp = preset_hparams(preset)
    c0 = time.process_time()
    model = build_model(hp.model, hp.seed)
    build_cpu_s = time.process_time() - c0
    codec = DeMoCodec.from_hparams(parameter_shapes(model), hp)
    ds = default_dataset(hp)
    sequences = 1 if quick else hp.micro_batch
    batch = ds.training_batch(0, 0, hp.assigned_sequences, sequences)
    c0 = time.process_time()
    grads, _ = compute_gradients(model, batch, hp.micro_batch)
    gradient_cpu_ms = (time.process_time() - c0) * 1000
    out = {"preset": preset, "d_model": hp.model.d_model, "n_layers": hp.model.n_layers,
           "vocab_size": hp.model.vocab_size, **measure(codec, grads, repeats=1 if quick else 3)}
    batch_cpu_ms = gradient_cpu_ms * hp.batch_size / sequences
    out.update({"build_cpu_s": build_cpu_s, "gradient_sequences": sequences, "gradient_cpu_ms": gradient_cpu_ms,
                "compression_share_of_window": compression_share(out["encode_cpu_ms"], out["decode_cpu_ms"],
                                                                 batch_cpu_ms),
                "peak_rss_mb": own_peak_rss_mb()})
    return out
