"""Device section: a miner's training throughput (tokens per second of inner AdamW steps) on the CPU and,
where torch sees one, on a CUDA GPU with bf16 autocast (docs/gpu.md).  On a machine without a GPU the
``cuda`` entry says so instead of a number."""
from __future__ import annotations

import time

import torch

from benchmarks.common import default_dataset

STEPS = {True: 3, False: 12}   # timed inner steps (quick / full), after one warm-up step


def tokens_per_second(device: str, steps: int) -> float:
    from dso.config import HParams
    from dso.inner import InnerLoop
    from dso.model import build_model

    hp = HParams()
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


def run(quick: bool) -> dict:
    steps = STEPS[quick]
    out: dict = {"cpu_tokens_per_second": tokens_per_second("cpu", steps), "cpu_threads": torch.get_num_threads(),
                 "steps": steps}
    if torch.cuda.is_available():
        out["cuda_tokens_per_second"] = tokens_per_second("cuda", steps)
        out["cuda_device"] = torch.cuda.get_device_name(0)
    else:
        out["cuda_tokens_per_second"] = None
        out["cuda_device"] = "none: torch sees no CUDA device on this machine (not measured)"
    return out
