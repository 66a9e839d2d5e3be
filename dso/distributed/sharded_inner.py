"""A miner's inner loop (dso/training/inner.py) over a model FSDP2 shards across the node's ranks.

Every rank holds its slices of the local weights, of the anchor θ_t, of the gradients and of the AdamW
moments; no rank holds the whole θ.  The anchor slices are the node's θ_{model_window}: the node follows
the network in them (dso/distributed/sliced_theta.py applies a bundle to every rank's anchor slices), so a
window starts with slices ← anchor on every rank, with no message.  Steps taken ahead are kept as
``local − anchor`` before θ moves (:meth:`ShardedInnerLoop.local_weights`) and put back onto the new anchor
after (:meth:`rebase_local`), each rank on its own slices.

Collective methods run on every rank in the same order.  On the leader each one first announces itself
(``announce(op, args)``, neurons/ranks.py sends it to the other ranks, which call :meth:`handle`), so the
leader alone decides what happens next — when to stop for the deadline, whether the network's θ has
arrived — exactly as :class:`dso.training.inner.InnerLoop` decides it in one process.

A step: the leader's batch goes to every rank; rank r takes the r-th contiguous slice of its sequences
(``torch.chunk``'s split) in micro-batches, every rank as many (a rank with fewer sequences runs a
zero-weighted pass, so the ranks' collectives stay paired).  Each loss term is weighted by its share of
the whole batch times the number of ranks, which FSDP's averaging reduce-scatter undoes: the gradient is
the batch's mean gradient, as in one process.  With as many sequences per rank as a micro-batch holds,
every micro-batch is the one a single process runs, and the sum of two is exact: the step matches the
single process's up to the order of the gradient-norm reduction.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from dso.config.schema import HParams
from dso.distributed.fsdp import local_slices
from dso.distributed.ranks import Ranks, all_sum, broadcast_flag, broadcast_tensor, gather_whole, release_free_memory
from dso.distributed.sharding import slice_range
from dso.nn.model import Decoder
from dso.training.inner import STATE_PREFIX, InnerLoop, InnerReport, Sequences, make_optimizer, optimizer_state
from dso.training.train import mixed_precision

Announce = Callable[[str, dict[str, Any]], None]


class ShardedInnerLoop(InnerLoop):
    def __init__(self, model: Decoder, hp: HParams, ranks: Ranks, dims: Mapping[str, int],
                 announce: Announce | None = None):
        """``model``: the FSDP-sharded model (dso/distributed/fsdp.py); ``dims``: the dimension each parameter is sliced
        along; ``announce``: the leader's way to tell the other ranks (None on them)."""
        self.ranks, self.dims = ranks, dict(dims)
        self._announce = announce
        self.slices = local_slices(model)
        super().__init__(model, hp)
        self.stash: dict[str, torch.Tensor] | None = None

    def new_anchor(self) -> dict[str, torch.Tensor]:
        """The anchor θ_t's slices: this rank's part of the node's θ (dso/distributed/sliced_theta.py fills it)."""
        return {n: s.detach().clone() for n, s in self.slices.items()}

    def new_optimizer(self) -> torch.optim.Optimizer:
        # one tensor at a time: the foreach form's temporaries would hold a whole slice of the model each
        return make_optimizer(list(self.params.values()), self.cfg, foreach=False)

    def announce(self, op: str, **args: Any) -> None:
        if self._announce is not None:
            self._announce(op, args)

    def handle(self, op: str, args: Mapping[str, Any]) -> None:
        """Run an operation the leader announced (on the other ranks)."""
        if op == "start":
            self.start(None)
        elif op == "restore_anchor":
            self.restore_anchor()
        elif op == "local_weights":
            self.local_weights()
        elif op == "set_weights":
            self.set_weights({})
        elif op == "step":
            self.step_slices(None, float(args["lr"]), tuple(args["shape"]), bool(args["cut"]))
        elif op == "warm_up":
            self.warm_up()
        elif op == "gradient":
            self.gradient_slices(None, tuple(args["shape"]))
        else:
            raise ValueError(f"unknown inner-loop operation {op!r}")

    def gather_full(self, name: str, mine: torch.Tensor) -> torch.Tensor | None:
        """The whole tensor from every rank's slice, on the leader (None elsewhere)."""
        return gather_whole(self.ranks, mine, tuple(self.params[name].shape), self.dims[name])

    # ------------------------------------------------------------ window
    @torch.no_grad()
    def start(self, theta: Mapping[str, torch.Tensor] | None = None) -> None:
        """Every rank's slices ← its anchor slices, θ_t (the node's θ lives in the anchor: it follows the network
        in it, dso/distributed/sliced_theta.py)."""
        if theta is not None:
            raise NotImplementedError("ShardedInnerLoop: load θ into the anchor with SlicedTheta.load()")
        self.announce("start")
        for name, s in self.slices.items():
            s.copy_(self.anchor[name])
        self.gradient = None
        if not self.cfg.persist_state:
            self.reset_optimizer()

    def rebase(self, theta_new: Mapping[str, torch.Tensor]) -> None:
        """Not offered: the anchor is the node's θ, which moves on every rank when a bundle is applied — keep the
        steps with :meth:`local_weights` before, put them back with :meth:`rebase_local` after."""
        raise NotImplementedError("ShardedInnerLoop: keep the steps with local_weights(), then rebase_local()")

    @torch.no_grad()
    def local_weights(self) -> dict[str, torch.Tensor]:
        """Keep every rank's steps since the anchor (``local − anchor``, float32: exact wherever the two are
        within a factor of two of each other, which inner steps keep them); the leader gets its own back as
        the token to pass to :meth:`set_weights` or :meth:`rebase_local`."""
        self.announce("local_weights")
        self.stash = {n: (s - self.anchor[n]).detach() for n, s in self.slices.items()}
        return self.stash

    @torch.no_grad()
    def set_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """The kept steps back onto the anchor (``weights``: the leader's token from :meth:`local_weights`)."""
        self.announce("set_weights")
        stash = self._take_stash(weights)
        for name, s in self.slices.items():
            torch.add(self.anchor[name], stash[name], out=s)

    def rebase_local(self, local: Mapping[str, torch.Tensor]) -> None:
        """The anchor now holds θ_new on every rank (the bundle was applied to it): local ← θ_new + the kept
        steps, as :meth:`InnerLoop.rebase` does in one process — each rank on its own slices."""
        self.set_weights(local)

    def _take_stash(self, token: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.stash is None or (self.ranks.leader and token is not self.stash):
            raise RuntimeError("local weights were not kept with local_weights() first")
        stash, self.stash = self.stash, None
        return stash

    @torch.no_grad()
    def restore_anchor(self) -> None:
        """Every rank's slices ← its anchor slices (θ_t)."""
        self.announce("restore_anchor")
        for name, s in self.slices.items():
            s.copy_(self.anchor[name])

    def train(self, window: int, assignment: Sequences, *, batch_size: int | None = None,
              max_steps: int | None = None, deadline: float | None = None,
              clock: Callable[[], float] = time.monotonic, interrupt: Callable[[], bool] | None = None,
              step_seconds: float = 0.0) -> InnerReport:
        """As :meth:`InnerLoop.train`; the leader decides every step, the ranks take them together."""
        if self.cfg.mode != "gradient":
            return super().train(window, assignment, batch_size=batch_size, max_steps=max_steps,
                                 deadline=deadline, clock=clock, interrupt=interrupt, step_seconds=step_seconds)
        batch = assignment[:batch_size or self.hp.batch_size]
        report = InnerReport()
        if deadline is not None and clock() >= deadline:
            report.stopped = "deadline"
            return report
        start = clock()
        self.announce("gradient", shape=list(batch.shape))
        loss = self.gradient_slices(batch, tuple(batch.shape))
        report.steps, report.sequences, report.losses = 1, batch.shape[0], [loss]
        report.seconds, report.stopped = clock() - start, "steps_max"
        return report

    def _step(self, batch: torch.Tensor, lr: float,
              overran: Callable[[], bool] | None = None) -> tuple[float, int]:
        self.announce("step", lr=lr, shape=list(batch.shape), cut=overran is not None)
        return self.step_slices(batch, lr, tuple(batch.shape), overran is not None, overran)

    # ------------------------------------------------------------- steps
    def warm_up(self) -> None:
        """One forward and backward of a zero-weighted sequence on every rank: FSDP's lazy start and the first
        collectives happen here rather than in a window's first step, whose time sets the next deadline."""
        self.announce("warm_up")
        part = torch.zeros((1, self.hp.model.seq_len + 1), dtype=torch.int64, device=self.ranks.device)
        with mixed_precision(part.device):
            loss = self.model.loss(part) * 0.0
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        self.model.zero_grad(set_to_none=True)
        release_free_memory()

    def _backward_slices(self, batch: torch.Tensor | None, shape: tuple[int, ...], cut: bool,
                         overran: Callable[[], bool] | None = None) -> tuple[float, int]:
        """Forward and backward of every rank's slice of the leader's batch; gradients reduce-scattered into
        the slices.  Returns (the batch's mean loss, sequences used), the same on every rank."""
        ranks, micro = self.ranks, self.hp.micro_batch
        whole = broadcast_tensor(ranks, batch, shape, torch.int64)
        n = shape[0]
        start, end = slice_range(n, ranks.rank, ranks.world)
        mine = whole[start:end]
        passes = math.ceil(math.ceil(n / ranks.world) / micro)
        self.model.zero_grad(set_to_none=True)
        total = seen = 0.0
        for i in range(passes):
            if i and cut and broadcast_flag(ranks, overran() if overran is not None else False):
                break
            part = mine[i * micro:(i + 1) * micro]
            weight = part.shape[0] * ranks.world / n
            if part.shape[0] == 0:  # keeps this rank's collectives paired with the others'
                part, weight = whole[:1], 0.0
            part = part.to(ranks.device)
            with mixed_precision(part.device):
                loss = self.model.loss(part) * weight
            loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
            total += loss.item()
            seen += part.shape[0] if weight else 0
        total, seen = all_sum(ranks, [total, seen])
        total /= ranks.world
        if seen < n:  # cut short: the terms were weighted for n sequences, the mean is over `seen`
            total *= n / seen
            for p in self.params.values():
                if p.grad is not None:
                    p.grad.mul_(n / seen)
        return total, int(seen)

    def step_slices(self, batch: torch.Tensor | None, lr: float, shape: tuple[int, ...], cut: bool,
                    overran: Callable[[], bool] | None = None) -> tuple[float, int]:
        """One optimiser step on every rank's slices (see the module's docstring)."""
        total, seen = self._backward_slices(batch, shape, cut, overran)
        params = list(self.params.values())
        norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.clip_norm if self.cfg.clip_norm > 0 else math.inf)
        whole_norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        if math.isfinite(total) and bool(torch.isfinite(whole_norm)):
            assert self.optimizer is not None  # steps mode builds one
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
            self.step_count += 1
        else:
            total = math.nan
        self.model.zero_grad(set_to_none=True)
        release_free_memory()
        return total, seen

    def gradient_slices(self, batch: torch.Tensor | None, shape: tuple[int, ...]) -> float:
        """Paper mode: the batch's mean gradient, kept as every rank's slices (the update of the window)."""
        total, _ = self._backward_slices(batch, shape, cut=False)
        self.gradient = {}
        for name, p in self.params.items():
            grad = p.grad
            local = grad.to_local() if isinstance(grad, DTensor) else grad
            self.gradient[name] = (torch.zeros_like(self.slices[name]) if local is None
                                   else local.detach().clone())
        self.model.zero_grad(set_to_none=True)
        return total

    @torch.no_grad()
    def pseudo_gradient(self) -> dict[str, torch.Tensor]:
        """This rank's slices of ``anchor − local`` (steps mode) or of the window's gradient (paper mode)."""
        if self.cfg.mode == "gradient":
            if self.gradient is None:
                return {n: torch.zeros_like(s) for n, s in self.slices.items()}
            return {n: g.clone() for n, g in self.gradient.items()}
        return {n: (self.anchor[n] - s).float() for n, s in self.slices.items()}

    # ------------------------------------------------------------- state
    def state(self) -> dict[str, torch.Tensor]:
        """This rank's slices of the optimiser's state (see :meth:`InnerLoop.state`; a rank's file)."""
        return optimizer_state(self.step_count, self.optimizer, self.params,
                               lambda v: v.to_local() if isinstance(v, DTensor) else v)

    def load_state(self, tensors: Mapping[str, torch.Tensor]) -> bool:
        """Restore :meth:`state` (this rank's file); on any mismatch keep a fresh state and return False."""
        count = tensors.get(f"{STATE_PREFIX}step_count")
        if count is None or tuple(count.shape) != (1,) or count.dtype != torch.int64 or int(count[0]) < 0:
            return False
        keys = {"adamw": ("exp_avg", "exp_avg_sq", "step"), "sgd": ("momentum_buffer",)}.get(self.cfg.optimizer, ())
        opt_keys = {k for k in tensors if k != f"{STATE_PREFIX}step_count"}
        want = {f"{STATE_PREFIX}opt.{n}.{key}" for n in self.params for key in keys} if self.optimizer else set()
        if opt_keys and opt_keys != want:
            return False
        restored: dict[torch.nn.Parameter, dict[str, torch.Tensor]] = {}
        for name, p in self.params.items() if opt_keys else ():
            entry = {}
            for key in keys:
                t = tensors[f"{STATE_PREFIX}opt.{name}.{key}"]
                shape = (1,) if key == "step" else tuple(self.slices[name].shape)
                if tuple(t.shape) != shape or not t.is_floating_point() or not bool(torch.isfinite(t).all()):
                    return False
                if key == "step":
                    entry[key] = t.reshape(()).clone()
                else:
                    local = t.to(self.slices[name].device).clone()
                    entry[key] = (DTensor.from_local(local, p.device_mesh, p.placements, shape=p.shape,
                                                     stride=p.stride()) if isinstance(p, DTensor) else local)
            restored[p] = entry
        self.reset_optimizer()
        if self.optimizer is not None:
            for p, entry in restored.items():
                self.optimizer.state[p] = entry
        self.step_count = int(count[0])
        return True
