"""In-process training of a network of simulated peers (no S3, no chain).

Used by ``scripts/simulate.py``, the convergence benchmark and tests.  Every
peer computes its pseudo-gradient at the shared θ_t on its assigned data, the
updates are aggregated with the protocol's signed aggregation, and the shared
model takes the signed step — exactly what a network of honest nodes computes,
without the transport.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from dso.aggregation import aggregate_signs, signed_step
from dso.codec import ErrorFeedback
from dso.codecs import Codec, make_codec
from dso.config import HParams
from dso.data import Dataset
from dso.model import build_model, parameter_shapes
from dso.privacy import clip_and_noise, dp_settings
from dso.train import compute_gradients, evaluate, learning_rate


class DenseCodec:
    """No compression: the update is the dense tensor itself (the baseline DeMo is compared with)."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]):
        self.shapes = shapes

    def compress_tensor(self, name: str, x: torch.Tensor, window: int, uid: int = 0) -> torch.Tensor:
        return x.detach().clone()

    def to_dense(self, name: str, u: torch.Tensor, device="cpu") -> torch.Tensor:
        return u.to(device)

    def mean_delta(self, updates: list, device="cpu") -> dict[str, torch.Tensor]:
        out = {}
        for name, shape in self.shapes.items():
            acc = torch.zeros(shape, device=device)
            for u in updates:
                norm = torch.linalg.vector_norm(u[name])
                if torch.isfinite(norm) and norm > 0:
                    acc += u[name].to(device) / norm
            out[name] = acc / max(1, len(updates))
        return out


@dataclass
class History:
    windows: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def rows(self) -> list[dict]:
        return [{"window": w, "loss": loss} for w, loss in zip(self.windows, self.val_loss)]


def run_honest(hp: HParams, dataset: Dataset, n_peers: int, windows: int, *, compress: bool = True,
               device: str = "cpu", on_window: Callable[[int, float], None] | None = None) -> History:
    """N honest peers for ``windows`` windows; validation loss before training and after every window.

    With ``hp.dp.enabled`` every peer clips and noises its gradient before error feedback, as the miner does
    (z from ``dso.privacy.dp_settings``; no budget stop: set ``dp.target_rounds`` to ``windows``)."""
    model = build_model(hp.model, hp.seed, device)
    noise_multiplier = dp_settings(hp.dp)[0] if hp.dp.enabled else 0.0
    noise = torch.Generator().manual_seed(hp.seed)
    shapes = parameter_shapes(model)
    codec: Codec | DenseCodec = make_codec(shapes, hp) if compress else DenseCodec(shapes)
    feedback = [ErrorFeedback(codec, hp.ef_beta, device) for _ in range(n_peers)]
    val = dataset.validation(hp.val_sequences)
    hist = History()
    start = time.perf_counter()

    def record(window: int, train: float) -> None:
        loss = evaluate(model, val, hp.micro_batch, device)
        hist.windows.append(window)
        hist.val_loss.append(loss)
        hist.train_loss.append(train)
        if on_window:
            on_window(window, loss)

    record(-1, float("nan"))
    for t in range(windows):
        updates, losses = [], []
        for uid in range(n_peers):
            batch = dataset.training_batch(uid, t, hp.assigned_sequences, hp.batch_size)
            grads, loss = compute_gradients(model, batch, hp.micro_batch, device)
            if hp.dp.enabled:
                grads = clip_and_noise(grads, hp.dp.clip_norm, noise_multiplier, noise)
            updates.append(feedback[uid].step(grads, t, uid))
            losses.append(loss)
        signed_step(model, aggregate_signs(codec, updates, hp, device=device)[0], learning_rate(hp, t), hp.weight_decay)
        record(t, sum(losses) / len(losses))
    hist.seconds = time.perf_counter() - start
    return hist


def run_adamw(hp: HParams, dataset: Dataset, n_peers: int, windows: int, *, lr: float = 2e-3,
              device: str = "cpu") -> History:
    """Data-parallel AdamW on the same peers' batches: one step per window on their mean gradient."""
    model = build_model(hp.model, hp.seed, device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=hp.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: learning_rate(hp, t) / hp.learning_rate)
    val = dataset.validation(hp.val_sequences)
    hist = History()
    start = time.perf_counter()
    hist.windows.append(-1)
    hist.val_loss.append(evaluate(model, val, hp.micro_batch, device))
    hist.train_loss.append(float("nan"))
    for t in range(windows):
        batch = torch.cat([dataset.training_batch(uid, t, hp.assigned_sequences, hp.batch_size)
                           for uid in range(n_peers)])
        grads, loss = compute_gradients(model, batch, hp.micro_batch, device)
        for name, p in model.named_parameters():
            p.grad = grads[name]
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        hist.windows.append(t)
        hist.val_loss.append(evaluate(model, val, hp.micro_batch, device))
        hist.train_loss.append(loss)
    hist.seconds = time.perf_counter() - start
    return hist
