"""The CPU-versus-CUDA check of θ_{t+1}: the same uploads aggregated on a CPU model and on a CUDA model.

Used by ``tests/unit/foundation/test_gpu_ready.py`` (skipped without a GPU) and ``scripts/bench.py --only device``.
"""
from __future__ import annotations

import copy

import torch

from dso.codec.codecs import Codec, make_codec
from dso.config.schema import HParams, ModelConfig
from dso.nn.model import Decoder, build_model, parameter_shapes
from dso.protocol.payload import Payload, PayloadMeta
from dso.training.inner import InnerLoop
from dso.training.outer import OuterState
from neurons.engine import aggregate_window


def small_hparams() -> HParams:
    """The tests' tiny model (tests/conftest.py ``tiny_hparams``)."""
    hp = HParams(tokenizer="bytes",
                 model=ModelConfig(vocab_size=256, d_model=32, n_layers=1, n_heads=2, ffn_hidden=64, seq_len=16))
    hp.batch_size, hp.assigned_sequences, hp.micro_batch, hp.chunk, hp.topk = 4, 8, 4, 16, 8
    hp.inner.steps_max = 2
    return hp


def payloads(hp: HParams, model: Decoder, codec: Codec, window: int) -> dict[int, Payload]:
    """Two peers' uploads of ``window``: inner steps on their own random sequences from ``model``."""
    out = {}
    for uid in (1, 2):
        loop = InnerLoop(copy.deepcopy(model), hp)
        data = torch.randint(0, hp.model.vocab_size, (2 * hp.batch_size, hp.model.seq_len + 1),
                             generator=torch.Generator().manual_seed(10 * window + uid))
        loop.train(window, data)
        out[uid] = Payload(PayloadMeta(uid, window, hp.protocol_version, hp.digest()),
                           codec.compress(loop.pseudo_gradient(), window, uid), torch.zeros(hp.sync_samples), 0, 0.0)
    return out


def aggregate_on_both(hp: HParams | None = None,
                      windows: int = 3) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(model hash, outer digest) after every window, on the CPU and on CUDA, from the same θ_0 and uploads."""
    hp = hp or small_hparams()
    cpu = build_model(hp.model, hp.seed)
    gpu = copy.deepcopy(cpu).to("cuda")
    shapes = parameter_shapes(cpu)
    codec = make_codec(shapes, hp)
    cpu_outer, gpu_outer = OuterState.fresh(shapes, hp), OuterState.fresh(shapes, hp)
    on_cpu, on_gpu = [], []
    for t in range(windows):
        uploads = payloads(hp, cpu, codec, t)  # the same uploads for both nodes
        a = aggregate_window(cpu, codec, hp, t, uploads, [1, 2], cpu_outer)
        b = aggregate_window(gpu, codec, hp, t, uploads, [1, 2], gpu_outer, device="cuda")
        on_cpu.append((a.hash_after, cpu_outer.digest()))
        on_gpu.append((b.hash_after, gpu_outer.digest()))
    return on_cpu, on_gpu
