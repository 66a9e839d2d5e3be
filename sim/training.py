"""In-process training of a network of honest peers (no S3, no chain), and its baselines.

Used by ``scripts/simulate.py``, the convergence and training benchmarks and tests.  Each window t
every peer starts its inner loop (dso/training/inner.py — the miner's own) at θ_t, trains ``steps`` inner
steps on its assignment (step i on sequences [i·B, (i+1)·B)), and compresses its pseudo-gradient
with error feedback; the aggregate of all peers in uid order takes the protocol's outer step
(dso/training/outer.py — the very functions ``neurons.engine.aggregate_window`` calls).  With ``overlap = k``
a peer trains the first k steps of window t+1 from its own weights before θ_{t+1} is known and
rebases onto it after.  No scoring and no adversaries: that is ``sim/simulator.py`` (SimNet); this
loop measures training only, so the benchmark can afford many windows.

The DDP baseline sees exactly the same sequences: step i of window t is one AdamW step on the mean
gradient of every peer's i-th batch (one all-reduce per step).
"""
from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dso.codec.codecs import Codec, Update, make_codec
from dso.codec.demo import ErrorFeedback
from dso.config.schema import HParams
from dso.data.dataset import Dataset
from dso.nn.model import Decoder, build_model, parameter_shapes
from dso.privacy.dp import dp_settings, noisy_release
from dso.training.inner import InnerLoop, inner_lr, make_optimizer
from dso.training.outer import OuterState, aggregate, apply_outer
from dso.training.train import compute_gradients, evaluate
from dso.training.window_training import Start, train_window


class DenseCodec:
    """No compression: the update is the dense tensor itself (the baseline DeMo is compared with)."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]):
        self.shapes = shapes

    def compress_tensor(self, name: str, x: torch.Tensor, window: int, uid: int = 0) -> torch.Tensor:
        return x.detach().clone()

    def to_dense(self, name: str, u: torch.Tensor, device: str | torch.device = "cpu") -> torch.Tensor:
        return u.to(device)

    def values(self, u: torch.Tensor) -> torch.Tensor:
        return u.reshape(-1)

    def payload_bytes(self) -> int:
        return 4 * sum(int(torch.Size(s).numel()) for s in self.shapes.values())

    def mean_delta(self, updates: list[dict[str, torch.Tensor]],
                   device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
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
    """Validation loss (nats per token) before training and after every window, and the costs."""

    windows: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)       # training tokens processed so far
    seconds: float = 0.0
    update_bytes: int = 0                                 # compressed update of one peer, one window

    def record(self, window: int, val: float, train: float, tokens: int) -> None:
        self.windows.append(window)
        self.val_loss.append(val)
        self.train_loss.append(train)
        self.tokens.append(tokens)

    def rows(self) -> list[dict[str, float]]:
        return [{"window": w, "loss": loss} for w, loss in zip(self.windows, self.val_loss, strict=True)]


def assignment(dataset: Dataset, uid: int, window: int, hp: HParams, steps: int) -> torch.Tensor:
    """The peer's sequences for the window: at least ``steps`` batches of ``batch_size``."""
    return dataset.assigned(uid, window, max(hp.assigned_sequences, steps * hp.batch_size))


class Peer:
    """One honest peer: its model copy, inner loop and error-feedback buffers."""

    def __init__(self, uid: int, model: Decoder, codec: Codec | DenseCodec, hp: HParams,
                 dp_noise: tuple[float, torch.Generator] | None = None):
        self.uid, self.dp_noise = uid, dp_noise  # (z, generator): clip and noise the pseudo-gradient as a miner does
        self.loop = InnerLoop(copy.deepcopy(model), hp)
        self.feedback = ErrorFeedback(codec, hp.ef_beta)
        self.pre_steps = 0  # steps of the next window already taken (overlap)

    def window(self, dataset: Dataset, t: int, theta: dict[str, torch.Tensor], hp: HParams, steps: int, overlap: int,
               last: bool) -> tuple[Update, float]:
        """Train window t from θ_t (rebasing the steps taken early), compress; then, with overlap, start
        window t+1 from θ_t as the miner does while θ_{t+1} is on its way (neurons/miner.py ``train_ahead``).
        Returns (compressed update, mean training loss)."""
        data = assignment(dataset, self.uid, t, hp, steps)
        release = None if self.dp_noise is None else noisy_release(hp.dp.clip_norm, *self.dp_noise)
        done = train_window(self.loop, self.feedback, t, self.uid,
                            lambda loop: loop.train(t, data[self.pre_steps * hp.batch_size:],
                                                    max_steps=steps - self.pre_steps),
                            start=Start(theta, ahead=self.pre_steps > 0), release=release)
        self.pre_steps = 0
        if overlap and not last and hp.inner.mode == "steps":
            # the model is back at θ_t, as the miner's (its upload and the bundle start from there)
            self.loop.start(None)  # anchor = θ_t; rebased onto θ_{t+1}: local ← θ_{t+1} + (local − θ_t)
            early = self.loop.train(t + 1, assignment(dataset, self.uid, t + 1, hp, steps), max_steps=overlap)
            self.pre_steps = early.steps
        return done.update, done.report.mean_loss


def run_network(hp: HParams, dataset: Dataset, peers: int, windows: int, steps: int | None = None, *,
                overlap: int = 0, compress: bool = True, device: str = "cpu",
                on_window: Callable[[int, float], None] | None = None) -> History:
    """``peers`` honest peers for ``windows`` windows of ``steps`` inner steps (default ``inner.steps_max``;
    1 in gradient mode), aggregated and applied with the run's outer rule."""
    model = build_model(hp.model, hp.seed, device)
    noise_multiplier = dp_settings(hp.dp)[0] if hp.dp.enabled else 0.0
    noise = torch.Generator().manual_seed(hp.seed)
    shapes = parameter_shapes(model)
    codec = make_codec(shapes, hp) if compress else DenseCodec(shapes)
    params = dict(model.named_parameters())
    state = OuterState.fresh(shapes, hp)
    dp_noise = (noise_multiplier, noise) if hp.dp.enabled else None
    group = [Peer(uid, model, codec, hp, dp_noise) for uid in range(peers)]
    steps = 1 if hp.inner.mode == "gradient" else (steps or hp.inner.steps_max)
    val = dataset.validation(hp.val_sequences)
    hist = History(update_bytes=codec.payload_bytes())
    start = time.perf_counter()
    hist.record(-1, evaluate(model, val, hp.micro_batch, device), float("nan"), 0)
    tokens_per_window = peers * steps * hp.batch_size * dataset.seq_len
    for t in range(windows):
        theta = {n: p.detach().clone() for n, p in params.items()}
        results = [peer.window(dataset, t, theta, hp, steps, overlap, t == windows - 1) for peer in group]
        agg = aggregate(codec, [u for u, _ in results], hp, list(range(peers)))
        apply_outer(params, agg.delta, state, hp, t)
        loss = evaluate(model, val, hp.micro_batch, device)
        hist.record(t, loss, sum(lo for _, lo in results) / peers, (t + 1) * tokens_per_window)
        if on_window:
            on_window(t, loss)
    hist.seconds = time.perf_counter() - start
    return hist


def run_honest(hp: HParams, dataset: Dataset, n_peers: int, windows: int, *, compress: bool = True,
               device: str = "cpu", on_window: Callable[[int, float], None] | None = None) -> History:
    """N honest peers with the run's inner loop and outer rule (``run_network`` at ``inner.steps_max``)."""
    return run_network(hp, dataset, n_peers, windows, compress=compress, device=device, on_window=on_window)


def run_ddp(hp: HParams, dataset: Dataset, peers: int, windows: int, steps: int, *, lr: float | None = None,
            device: str = "cpu", on_window: Callable[[int, float], None] | None = None,
            until: float | None = None) -> History:
    """Data-parallel AdamW on the same sequences: per step, the mean gradient of every peer's batch.

    Uses the inner optimiser's settings (``hp.inner``) with ``lr`` overriding the peak rate.  ``until``
    (``time.perf_counter()`` units): start no window that would end after it, by the mean window so far
    (the history ends early)."""
    model = build_model(hp.model, hp.seed, device)
    cfg = dataclasses.replace(hp.inner, lr=lr) if lr is not None else hp.inner
    opt = make_optimizer(model.parameters(), dataclasses.replace(cfg, optimizer="adamw"))
    val = dataset.validation(hp.val_sequences)
    hist = History()
    start = time.perf_counter()
    hist.record(-1, evaluate(model, val, hp.micro_batch, device), float("nan"), 0)
    count = 0
    for t in range(windows):
        now = time.perf_counter()
        if until is not None and now + ((now - start) / t if t else 0.0) > until:
            break
        data = [assignment(dataset, uid, t, hp, steps) for uid in range(peers)]
        losses = []
        for i in range(steps):
            batch = torch.cat([d[i * hp.batch_size:(i + 1) * hp.batch_size] for d in data])
            grads, loss = compute_gradients(model, batch, hp.micro_batch, device)
            for name, p in model.named_parameters():
                p.grad = grads[name]
            if cfg.clip_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
            for g in opt.param_groups:
                g["lr"] = inner_lr(cfg, t, count)
            opt.step()
            opt.zero_grad(set_to_none=True)
            count += 1
            losses.append(loss)
        val_loss = evaluate(model, val, hp.micro_batch, device)
        hist.record(t, val_loss, sum(losses) / len(losses), (t + 1) * peers * steps * hp.batch_size * dataset.seq_len)
        if on_window:
            on_window(t, val_loss)
    hist.seconds = time.perf_counter() - start
    return hist


def run_adamw(hp: HParams, dataset: Dataset, n_peers: int, windows: int, *, lr: float = 2e-3,
              device: str = "cpu") -> History:
    """Data-parallel AdamW at ``inner.steps_max`` steps per window: the reference of ``run_honest``."""
    steps = 1 if hp.inner.mode == "gradient" else hp.inner.steps_max
    return run_ddp(hp, dataset, n_peers, windows, steps, lr=lr, device=device)
