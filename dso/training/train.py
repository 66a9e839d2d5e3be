"""A miner's local work for one window, and loss evaluation."""
from __future__ import annotations

import contextlib
import math

import torch

from dso.config.schema import HParams
from dso.nn.model import Decoder


def learning_rate(hp: HParams, window: int) -> float:
    """α_t: linear warm-up over ``warmup_windows``, then constant."""
    if hp.warmup_windows <= 0:
        return hp.learning_rate
    return hp.learning_rate * min(1.0, (window + 1) / hp.warmup_windows)


def autocast_dtype(device: torch.device, bf16_supported: bool | None = None) -> torch.dtype | None:
    """The autocast dtype for forward passes on ``device``: bfloat16 on a CUDA device that supports it, else
    None (fp32).  What stays fp32 everywhere: the master weights and their gradients, the optimiser state,
    the loss reduction (autocast keeps cross-entropy in fp32), the aggregate and the outer step (docs/gpu.md)."""
    if device.type != "cuda":
        return None
    supported = torch.cuda.is_bf16_supported() if bf16_supported is None else bf16_supported
    return torch.bfloat16 if supported else None


def mixed_precision(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """Autocast for the forward pass of training and evaluation on ``device`` (a no-op on CPU)."""
    dtype = autocast_dtype(device)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def compute_gradients(model: Decoder, batch: torch.Tensor, micro_batch: int,
                      device: str | torch.device = "cpu") -> tuple[dict[str, torch.Tensor], float]:
    """Mean-loss gradient over ``batch`` by gradient accumulation; returns (grads, mean loss)."""
    model.zero_grad(set_to_none=True)
    total, n = 0.0, batch.shape[0]
    for start in range(0, n, micro_batch):
        part = batch[start:start + micro_batch].to(device)
        with mixed_precision(part.device):
            loss = model.loss(part) * (part.shape[0] / n)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        total += loss.item()
    # a parameter the loss does not reach keeps grad None (zero_grad set_to_none): its gradient is zero
    grads = {name: torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
             for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads, total


@torch.no_grad()
def evaluate(model: Decoder, batch: torch.Tensor, micro_batch: int, device: str | torch.device = "cpu") -> float:
    total, n = 0.0, batch.shape[0]
    for start in range(0, n, micro_batch):
        part = batch[start:start + micro_batch].to(device)
        with mixed_precision(part.device):
            total += float(model.loss(part)) * part.shape[0]
    return total / n


def bits_per_byte(nats_per_token: float, tokens: int, nbytes: int) -> float:
    """Loss in bits per byte of text: ``nats_per_token · tokens / (nbytes · ln 2)``.

    ``tokens`` is how many target tokens the mean loss was taken over and ``nbytes`` the bytes they
    decode to (:meth:`dso.data.dataset.Dataset.target_bytes`), so runs with different tokenisers compare."""
    if tokens <= 0 or nbytes <= 0:
        raise ValueError(f"bits_per_byte needs tokens > 0 and nbytes > 0, got {tokens} and {nbytes}")
    return nats_per_token * tokens / (nbytes * math.log(2))


@torch.no_grad()
def sequence_losses(model: Decoder, batch: torch.Tensor, micro_batch: int,
                    device: str | torch.device = "cpu") -> torch.Tensor:
    """The loss of each sequence of ``batch`` (float64 on the CPU, shape (n,)): what the proof of computation
    compares sequence by sequence."""
    parts = []
    for start in range(0, batch.shape[0], micro_batch):
        part = batch[start:start + micro_batch].to(device)
        with mixed_precision(part.device):
            parts.append(model.sequence_losses(part).to("cpu", torch.float64))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)
