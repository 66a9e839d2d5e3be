"""A miner's local work for one window, and loss evaluation."""
from __future__ import annotations

import math

import torch

from dso.config import HParams
from dso.model import Decoder


def learning_rate(hp: HParams, window: int) -> float:
    """α_t: linear warm-up over ``warmup_windows``, then constant."""
    if hp.warmup_windows <= 0:
        return hp.learning_rate
    return hp.learning_rate * min(1.0, (window + 1) / hp.warmup_windows)


def compute_gradients(model: Decoder, batch: torch.Tensor, micro_batch: int,
                      device: str | torch.device = "cpu") -> tuple[dict[str, torch.Tensor], float]:
    """Mean-loss gradient over ``batch`` by gradient accumulation; returns (grads, mean loss)."""
    model.zero_grad(set_to_none=True)
    total, n = 0.0, batch.shape[0]
    for start in range(0, n, micro_batch):
        part = batch[start:start + micro_batch].to(device)
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
        total += float(model.loss(part)) * part.shape[0]
    return total / n


def bits_per_byte(nats_per_token: float, tokens: int, nbytes: int) -> float:
    """Loss in bits per byte of text: ``nats_per_token · tokens / (nbytes · ln 2)``.

    ``tokens`` is how many target tokens the mean loss was taken over and ``nbytes`` the bytes they
    decode to (:meth:`dso.data.Dataset.target_bytes`), so runs with different tokenisers compare."""
    if tokens <= 0 or nbytes <= 0:
        raise ValueError(f"bits_per_byte needs tokens > 0 and nbytes > 0, got {tokens} and {nbytes}")
    return nats_per_token * tokens / (nbytes * math.log(2))
