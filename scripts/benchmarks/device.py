"""Device section: a miner's training throughput (tokens per second of inner AdamW steps) on the CPU and,
where torch sees one, on CUDA GPUs with bf16 autocast (docs/gpu.md, docs/scale.md).

On the CPU: the default model, one thread.  Where CUDA is available, also:

* ``cuda.<preset>`` for ``125m`` and ``1b``: tokens/s and MFU of the inner step on one GPU
  (dso.training.inner.InnerLoop), and with every GPU of the machine as FSDP2 ranks (``fsdp_ranks``; NCCL) — MFU is
  model FLOPs (6 per parameter and token, plus attention's 12 · layers · d_model · seq_len) over the card's
  dense bf16 peak (``PEAK_BF16_TFLOPS``, by device name; null for a card not in the table);
* ``theta_bit_identical``: three windows aggregated on a CPU model and on a CUDA model end with the same
  model hash and outer-state digest (1) or not (0) — the check ``tests/unit/foundation/test_gpu_ready.py`` skips
  without a GPU.

On a machine without a GPU the ``cuda`` entries say so instead of a number (nothing is measured there)."""
from __future__ import annotations

import time

import torch

from benchmarks.common import default_dataset, preset_hparams

STEPS = {True: 3, False: 12}   # timed inner steps (quick / full), after one warm-up step
GPU_STEPS = {True: 3, False: 10}
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "GH200": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0,
                    "A10": 125.0, "4090": 165.2}
NO_GPU = "none: torch sees no CUDA device on this machine (not measured; docs/gpu.md says how to measure)"


def tokens_per_second(device: str, steps: int, hp=None) -> float:
    from dso.config.schema import HParams
    from dso.nn.model import build_model
    from dso.training.inner import InnerLoop

    hp = hp or HParams()
    dataset = default_dataset(hp)
    model = build_model(hp.model, hp.seed, device)
    loop = InnerLoop(model, hp)
    data = dataset.assigned(0, 0, (steps + 1) * hp.batch_size)
    loop.start(None)
    loop.train(0, data[:hp.batch_size], max_steps=1)  # warm-up: allocator, kernels
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    report = loop.train(0, data[hp.batch_size:], max_steps=steps)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return report.sequences * hp.model.seq_len / seconds


def flops_per_token(cfg) -> float:
    """Training FLOPs per token: 6 per parameter (the tied head's matmul included) and attention's scores."""
    from dso.nn.presets import total_parameters
    params = total_parameters(cfg.d_model, cfg.n_layers, cfg.ffn_hidden, cfg.vocab_size)
    return 6.0 * params + 12.0 * cfg.n_layers * cfg.d_model * cfg.seq_len


def peak_tflops(name: str) -> float | None:
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def cuda_preset(preset: str, steps: int) -> dict:
    """One GPU, then every GPU as FSDP2 ranks: tokens/s, MFU and peak memory of the inner step."""
    from sim.ranks import run_ranks
    from sim.scale import throughput_ranks

    hp = preset_hparams(preset)
    peak = peak_tflops(torch.cuda.get_device_name(0))
    torch.cuda.reset_peak_memory_stats()
    one = tokens_per_second("cuda", steps, hp)
    out = {"tokens_per_second": one, "peak_gpu_memory_gb": torch.cuda.max_memory_allocated() / 2 ** 30,
           "mfu": None if peak is None else one * flops_per_token(hp.model) / (peak * 1e12)}
    gpus = torch.cuda.device_count()
    if gpus > 1:
        ranked = run_ranks(throughput_ranks, gpus, hp, steps, "cuda", timeout=1800)[0]
        ranked["mfu"] = None if peak is None else (ranked["tokens_per_second"] * flops_per_token(hp.model)
                                                   / (gpus * peak * 1e12))
        out["fsdp_ranks"] = ranked
    return out


def theta_bit_identical() -> int:
    from sim.gpu import aggregate_on_both
    cpu, gpu = aggregate_on_both(windows=3)
    return int(cpu == gpu)


def run(quick: bool) -> dict:
    steps = STEPS[quick]
    out: dict = {"cpu_tokens_per_second": tokens_per_second("cpu", steps), "cpu_threads": torch.get_num_threads(),
                 "steps": steps}
    if not torch.cuda.is_available():
        out.update(cuda_tokens_per_second=None, cuda_device=NO_GPU, cuda=None, theta_bit_identical=None)
        return out
    out["cuda_device"] = torch.cuda.get_device_name(0)
    out["cuda_devices"] = torch.cuda.device_count()
    out["cuda_peak_bf16_tflops"] = peak_tflops(out["cuda_device"])
    out["cuda_tokens_per_second"] = tokens_per_second("cuda", steps)
    out["cuda"] = {preset: cuda_preset(preset, GPU_STEPS[quick]) for preset in ("125m", "1b")}
    out["theta_bit_identical"] = theta_bit_identical()
    return out
