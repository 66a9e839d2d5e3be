"""A miner's inner loop for one window, its pseudo-gradient, and the rebase onto a new θ.

Mode ``steps`` (DiLoCo / SparseLoCo style): from an *anchor* — the network's θ_t, or the miner's
own weights when it keeps training through the put window — take up to
``H = min(inner.steps_max, len(assignment) // batch_size, the caller's limit)`` optimiser steps,
step i on sequences ``[i·B, (i+1)·B)`` of the peer's assignment, and stop at the deadline: when a full
step would overrun it, a last step on the quarters of the batch that still fit (a window's time is used,
not left idle for up to a step), else none; a step that runs past the deadline anyway (the machine got
slower mid-step) ends at the next micro-batch, on the sequences it has seen.  The pseudo-gradient is
``anchor − θ_local``.

Mode ``gradient`` (the Gauntlet paper's): one gradient of the first B assigned sequences at the
anchor; the update is that gradient and the weights do not move.

Rebase: θ_{t+1} arrives while the miner already trains window t+1 from its anchor.
:meth:`InnerLoop.rebase` shifts the local weights by ``θ_{t+1} − anchor`` and makes θ_{t+1} the
anchor, so every step already taken is kept (``local − anchor`` is unchanged) and the next
pseudo-gradient is measured from θ_{t+1}.

State — the optimiser's moments and the miner's inner step counter — is a flat dict of tensors
(safetensors, no pickle); see docs/training.md for why it persists across windows by default.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch

from dso.config.schema import HParams, InnerConfig
from dso.nn.model import Decoder
from dso.training.train import compute_gradients, mixed_precision

STATE_PREFIX = "inner."
SHORT_STEP_PARTS = 4  # a step shortened by the deadline takes whole quarters of the batch
_STATE_KEYS = {"adamw": {"exp_avg": "param", "exp_avg_sq": "param", "step": "scalar"},
               "sgd": {"momentum_buffer": "param"}}


def inner_lr(cfg: InnerConfig, window: int, step_count: int) -> float:
    """Learning rate of the miner's next inner step.

    Linear warm-up over the miner's first ``warmup_steps`` inner steps (its own counter, so it does
    not depend on how many steps other miners take), times the window schedule: constant, or a
    cosine from the peak at window 0 to ``min_lr_ratio`` at ``decay_windows`` (then held)."""
    warm = min(1.0, (step_count + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0
    factor = 1.0
    if cfg.schedule == "cosine":
        progress = min(max(window, 0) / cfg.decay_windows, 1.0)
        factor = cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.lr * warm * factor


def make_optimizer(params: Iterable[torch.nn.Parameter], cfg: InnerConfig,
                   foreach: bool | None = None) -> torch.optim.Optimizer:
    """The inner optimiser; ``foreach=False`` updates one tensor at a time (no whole-model temporaries)."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.beta1, weight_decay=cfg.weight_decay,
                               foreach=foreach)
    return torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                             weight_decay=cfg.weight_decay, foreach=foreach)


class Sequences(Protocol):
    """A window's sequences in training order: a tensor, or a dso.data.dataset.Assignment read as training
    reaches it."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    def __getitem__(self, key: slice, /) -> torch.Tensor: ...


@dataclass
class InnerReport:
    """What one call of :meth:`InnerLoop.train` did (for logs and the utilisation figure)."""

    steps: int = 0
    sequences: int = 0
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0    # clock time spent in steps
    stopped: str = ""       # steps_max | limit | assignment | deadline | non_finite | interrupted

    @property
    def mean_loss(self) -> float:
        return sum(self.losses) / len(self.losses) if self.losses else math.nan

    def then(self, later: InnerReport) -> InnerReport:
        """One report of this call followed by ``later`` (a window trained in two parts)."""
        return InnerReport(self.steps + later.steps, self.sequences + later.sequences, self.losses + later.losses,
                           self.seconds + later.seconds, later.stopped or self.stopped)


@dataclass
class Ahead:
    """Inner steps of ``window`` taken before its θ was known, already rebased onto it (the anchor)."""

    window: int
    report: InnerReport


class InnerLoop:
    """One miner's local training: owns the anchor, the optimiser and the step counter."""

    def __init__(self, model: Decoder, hp: HParams):
        self.model, self.hp, self.cfg = model, hp, hp.inner
        self.params = dict(model.named_parameters())
        self.anchor = self.new_anchor()
        self.optimizer = self.new_optimizer() if self.cfg.mode == "steps" else None
        self.step_count = 0
        self.gradient: dict[str, torch.Tensor] | None = None

    def new_anchor(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.params.items()}

    def new_optimizer(self) -> torch.optim.Optimizer:
        return make_optimizer(list(self.params.values()), self.cfg)

    # ------------------------------------------------------------ window
    @torch.no_grad()
    def start(self, theta: Mapping[str, torch.Tensor] | None = None) -> None:
        """Begin a window: load θ into the model (None keeps the local weights) and make it the anchor."""
        for name, p in self.params.items():
            if theta is not None:
                p.copy_(theta[name])
            self.anchor[name].copy_(p)
        self.gradient = None
        if not self.cfg.persist_state:
            self.reset_optimizer()

    @torch.no_grad()
    def rebase(self, theta_new: Mapping[str, torch.Tensor]) -> None:
        """local ← θ_new + (local − anchor), anchor ← θ_new: keeps every step taken since the anchor
        (:func:`rebase_tensor`, exact but for the final rounding)."""
        for name, p in self.params.items():
            rebase_tensor(p, p, self.anchor[name], theta_new[name].to(p.device))

    @torch.no_grad()
    def local_weights(self) -> dict[str, torch.Tensor]:
        """A copy of the model's current (local) weights."""
        return {n: p.detach().clone() for n, p in self.params.items()}

    @torch.no_grad()
    def rebase_local(self, local: Mapping[str, torch.Tensor]) -> None:
        """The model now holds θ_new (the anchor's successor, e.g. the anchor with the network's bundle
        applied); put the local weights ``local`` (trained from the anchor) back, rebased onto it:
        ``local ← θ_new + (local − anchor)``, ``anchor ← θ_new``: :meth:`rebase`'s arithmetic, a tensor at a time
        in place (no copy of θ_new: a bundle landing in train-ahead is a miner's highest point)."""
        for name, p in self.params.items():
            rebase_tensor(p, local[name], self.anchor[name], p)

    @torch.no_grad()
    def set_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load ``weights`` into the model (the anchor stays)."""
        for name, p in self.params.items():
            p.copy_(weights[name])

    @torch.no_grad()
    def restore_anchor(self) -> None:
        """Put the anchor (θ_t) back into the model: the miner follows the network from θ_t."""
        for name, p in self.params.items():
            p.copy_(self.anchor[name])

    def reset_optimizer(self) -> None:
        if self.optimizer is not None:
            self.optimizer.state.clear()

    def fresh(self) -> None:
        """A new miner's state: no optimiser moments, no inner steps counted (warm-up starts again)."""
        self.reset_optimizer()
        self.step_count = 0

    def train(self, window: int, assignment: Sequences, *, batch_size: int | None = None,
              max_steps: int | None = None, deadline: float | None = None,
              clock: Callable[[], float] = time.monotonic, interrupt: Callable[[], bool] | None = None,
              step_seconds: float = 0.0) -> InnerReport:
        """Train on ``assignment`` (the peer's sequences for the window, in order) until a bound is hit.

        ``deadline`` is in ``clock`` units; a step is started only if the time per sequence so far says it
        ends before the deadline (before the first one: ``step_seconds`` per full step, what a step took
        before, 0 = only the deadline must not have passed).  When a full step would overrun, the last
        step of the call is shortened to the quarters of the batch that still fit (``fitting_batch``).
        ``interrupt`` is asked before every step (steps mode): True stops training (``stopped =
        "interrupted"``), e.g. when the network's next θ has arrived."""
        batch = batch_size or self.hp.batch_size
        report = InnerReport()
        if self.cfg.mode == "gradient":
            if deadline is not None and clock() >= deadline:
                report.stopped = "deadline"
                return report
            start = clock()
            self.gradient, loss = compute_gradients(self.model, assignment[:batch], self.hp.micro_batch,
                                                    next(iter(self.params.values())).device)
            report.steps, report.sequences, report.losses = 1, min(batch, assignment.shape[0]), [loss]
            report.seconds, report.stopped = clock() - start, "steps_max"
            return report
        limits = [(self.cfg.steps_max, "steps_max"), (assignment.shape[0] // batch, "assignment")]
        if max_steps is not None:
            limits.append((max_steps, "limit"))
        bound, report.stopped = min(limits, key=lambda x: x[0])
        start = clock()
        for _ in range(bound):
            if interrupt is not None and interrupt():
                report.stopped = "interrupted"
                break
            now = clock()
            per_sequence = (now - start) / report.sequences if report.sequences else step_seconds / batch
            size = batch if deadline is None else self.fitting_batch(deadline - now, per_sequence, batch)
            if size == 0:
                report.stopped = "deadline"
                break
            done = report.sequences
            overran = None if deadline is None else (lambda: clock() >= deadline)
            loss, size = self._step(assignment[done:done + size], inner_lr(self.cfg, window, self.step_count),
                                    overran)
            if not math.isfinite(loss):
                report.stopped = "non_finite"
                break
            report.steps += 1
            report.sequences += size
            report.losses.append(loss)
            if size < batch:  # the window's last, shortened step
                report.stopped = "deadline"
                break
        report.seconds = clock() - start
        return report

    def fitting_batch(self, room: float, per_sequence: float, batch: int) -> int:
        """Sequences of the next step that end within ``room`` seconds at ``per_sequence`` each: the whole
        batch, else as many quarters of it as fit (a shortened last step uses the time a full one would
        leave idle; a quarter keeps its gradient from being a handful of sequences), else 0.  No time left
        (``room`` < 0) is 0 even at an unknown speed."""
        if room < 0:
            return 0
        if per_sequence * batch <= room:
            return batch
        granule = max(1, batch // SHORT_STEP_PARTS)
        fits = int(room // (per_sequence * granule)) * granule
        return fits if 0 < fits < batch else 0

    def _step(self, batch: torch.Tensor, lr: float,
              overran: Callable[[], bool] | None = None) -> tuple[float, int]:
        """One optimiser step on ``batch`` (gradient accumulation over micro-batches) → (mean loss, sequences
        used).  ``overran`` is asked after each micro-batch but the last: True ends the step there, on the
        sequences seen so far (their mean gradient).  A non-finite loss or gradient leaves the weights
        untouched."""
        self.model.zero_grad(set_to_none=True)
        device = next(iter(self.params.values())).device
        total, n, seen = 0.0, batch.shape[0], 0
        while seen < n and not (seen and overran is not None and overran()):
            part = batch[seen:seen + self.hp.micro_batch].to(device)
            with mixed_precision(part.device):  # bf16 forward on CUDA; weights, grads and AdamW state stay fp32
                loss = self.model.loss(part) * (part.shape[0] / n)
            loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
            total += loss.item()
            seen += part.shape[0]
        params = list(self.params.values())
        if seen < n:  # cut short: the terms were weighted for n sequences, the mean is over `seen`
            total *= n / seen
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(n / seen)
        norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.clip_norm if self.cfg.clip_norm > 0 else math.inf)
        if math.isfinite(total) and bool(torch.isfinite(norm)):
            assert self.optimizer is not None  # steps mode builds one
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
            self.step_count += 1
        else:
            total = math.nan
        self.model.zero_grad(set_to_none=True)
        return total, seen

    @torch.no_grad()
    def pseudo_gradient(self) -> dict[str, torch.Tensor]:
        """``anchor − local`` (float32) in steps mode; the window's gradient in gradient mode (zeros
        when none was computed)."""
        if self.cfg.mode == "gradient":
            if self.gradient is None:
                return {n: torch.zeros_like(p) for n, p in self.params.items()}
            return {n: g.clone() for n, g in self.gradient.items()}
        return {n: (self.anchor[n] - p).float() for n, p in self.params.items()}

    # ------------------------------------------------------------- state
    def state(self) -> dict[str, torch.Tensor]:
        """Flat tensors: ``inner.step_count`` and ``inner.opt.<param>.<key>`` (0-d values as shape (1,))."""
        return optimizer_state(self.step_count, self.optimizer, self.params)

    def load_state(self, tensors: Mapping[str, torch.Tensor]) -> bool:
        """Restore :meth:`state`; on any mismatch (keys, shapes, non-finite values) keep a fresh state
        and return False."""
        kinds = _STATE_KEYS.get(self.cfg.optimizer, {}) if self.optimizer is not None else {}
        count = tensors.get(f"{STATE_PREFIX}step_count")
        if count is None or tuple(count.shape) != (1,) or count.dtype != torch.int64 or int(count[0]) < 0:
            return False
        opt_keys = {k for k in tensors if k != f"{STATE_PREFIX}step_count"}
        want = {f"{STATE_PREFIX}opt.{n}.{key}" for n in self.params for key in kinds}
        if opt_keys and opt_keys != want:
            return False
        state: dict[int, dict[str, torch.Tensor]] = {}
        for i, (name, p) in enumerate(self.params.items()):
            if not opt_keys:
                break
            entry = {}
            for key, kind in kinds.items():
                t = tensors[f"{STATE_PREFIX}opt.{name}.{key}"]
                shape = tuple(p.shape) if kind == "param" else (1,)
                if tuple(t.shape) != shape or not t.is_floating_point() or not bool(torch.isfinite(t).all()):
                    return False
                entry[key] = t.reshape(()) if kind == "scalar" else t.clone()
            state[i] = entry
        self.reset_optimizer()
        if state and self.optimizer is not None:
            groups = self.optimizer.state_dict()["param_groups"]
            self.optimizer.load_state_dict({"state": state, "param_groups": groups})
        self.step_count = int(count[0])
        return True


def optimizer_state(step_count: int, optimizer: torch.optim.Optimizer | None, params: Mapping[str, torch.Tensor],
                    local: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> dict[str, torch.Tensor]:
    """``inner.step_count`` and each parameter's optimiser tensors as ``inner.opt.<param>.<key>`` (0-d values as
    shape (1,)); ``local`` turns a tensor into the part this process holds (a rank's slice of a DTensor)."""
    out = {f"{STATE_PREFIX}step_count": torch.tensor([step_count], dtype=torch.int64)}
    if optimizer is None:
        return out
    for name, p in params.items():
        for key, value in optimizer.state.get(p, {}).items():
            if isinstance(value, torch.Tensor):
                mine = local(value).detach().cpu()
                out[f"{STATE_PREFIX}opt.{name}.{key}"] = mine.reshape(mine.shape or (1,)).clone().contiguous()
    return out


@torch.no_grad()
def rebase_tensor(param: torch.Tensor, trained: torch.Tensor, anchor: torch.Tensor, theta_new: torch.Tensor) -> None:
    """``param ← θ_new + (trained − anchor)``, ``anchor ← θ_new``, in place (``param`` may be ``trained`` or
    ``θ_new`` itself).  The displacement is exact in float64 (a difference of two float32), so the only rounding
    is the final one to float32."""
    moved = trained.double() - anchor.double()
    anchor.copy_(theta_new)
    param.copy_(anchor.double() + moved)
