"""The miner's inner loop (dso/training/inner.py): bounds, data order, pseudo-gradient, rebase, state."""
import copy
import math

import pytest
import safetensors.torch
import torch

from dso.config.schema import HParams, ModelConfig
from dso.nn.model import build_model
from dso.training.inner import InnerLoop, inner_lr
from dso.training.train import compute_gradients

torch.set_num_threads(1)


def _hp(**inner) -> HParams:
    hp = HParams()
    hp.model = ModelConfig(d_model=32, n_layers=1, n_heads=2, ffn_hidden=64, seq_len=16)
    hp.batch_size, hp.micro_batch = 4, 2
    for k, v in inner.items():
        setattr(hp.inner, k, v)
    return hp


def _data(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n, 17), generator=torch.Generator().manual_seed(seed))


def _params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


class StepClock:
    """A fake clock that advances one unit per full inner step of ``hp.batch_size`` sequences, in proportion
    for a shorter one (and not otherwise)."""

    def __init__(self, loop: InnerLoop):
        self.now = 0.0
        step = loop._step

        def timed(batch, lr, overran=None):
            self.now += batch.shape[0] / loop.hp.batch_size
            return step(batch, lr, overran)
        loop._step = timed

    def __call__(self) -> float:
        return self.now


def test_inner_lr_warmup_and_cosine():
    cfg = _hp(lr=1e-3, warmup_steps=4, schedule="constant").inner
    assert [inner_lr(cfg, 0, s) for s in range(5)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
    cfg = _hp(lr=1e-3, warmup_steps=0, schedule="cosine", decay_windows=10, min_lr_ratio=0.1).inner
    assert inner_lr(cfg, 0, 99) == pytest.approx(1e-3)
    assert inner_lr(cfg, 5, 99) == pytest.approx(1e-4 + 0.9e-3 * 0.5)
    assert inner_lr(cfg, 10, 99) == pytest.approx(1e-4) and inner_lr(cfg, 50, 99) == pytest.approx(1e-4)


def test_steps_follow_the_assignment_and_match_plain_adamw():
    """Step i trains on sequences [i·B, (i+1)·B); the result is exactly torch AdamW on those batches."""
    hp = _hp(steps_max=3, warmup_steps=0, clip_norm=0.0)
    model = build_model(hp.model, 1)
    reference = copy.deepcopy(model)
    loop = InnerLoop(model, hp)
    data = _data(20)
    theta = _params(model)
    loop.start(theta)
    report = loop.train(0, data)
    assert (report.steps, report.sequences, report.stopped) == (3, 12, "steps_max")
    opt = torch.optim.AdamW(reference.parameters(), lr=hp.inner.lr, betas=(hp.inner.beta1, hp.inner.beta2),
                            eps=hp.inner.eps, weight_decay=hp.inner.weight_decay)
    for i in range(3):
        grads, _ = compute_gradients(reference, data[4 * i:4 * i + 4], hp.micro_batch)
        for n, p in reference.named_parameters():
            p.grad = grads[n]
        opt.step()
    for n, p in reference.named_parameters():
        assert torch.equal(dict(model.named_parameters())[n], p)
        assert torch.equal(loop.pseudo_gradient()[n], theta[n] - p.detach())


def test_bounds_assignment_limit_and_deadline():
    hp = _hp(steps_max=8)
    loop = InnerLoop(build_model(hp.model, 1), hp)
    loop.start()
    assert loop.train(0, _data(10)).stopped == "assignment"  # 10 // 4 = 2 steps
    loop.start()
    r = loop.train(0, _data(40), max_steps=3)
    assert (r.steps, r.stopped) == (3, "limit")
    loop.start()
    clock = StepClock(loop)
    r = loop.train(0, _data(40), deadline=2.5, clock=clock)
    # full steps start at t = 0, 1 (1 + mean step 1 <= 2.5); at t = 2 a full step would end at 3 > 2.5, two
    # quarters of it (2 of the 4 sequences, 0.5) still fit: a shortened last step on sequences 8-9
    assert (r.steps, r.sequences, r.stopped, r.seconds) == (3, 10, "deadline", 2.5)
    clock.now = 10.0
    r = loop.train(0, _data(40), deadline=9.0, clock=clock)
    assert (r.steps, r.stopped) == (0, "deadline")
    assert loop.step_count == 2 + 3 + 3
    # a known step duration bounds the first step too: at 10 with steps of 1, a deadline of 10.2 allows none
    # (a quarter step takes 0.25), 10.5 a half step
    assert loop.train(0, _data(40), deadline=10.2, clock=clock, step_seconds=1.0).steps == 0
    r = loop.train(0, _data(40), deadline=10.5, clock=clock, step_seconds=1.0)
    assert (r.steps, r.sequences) == (1, 2)
    assert loop.train(0, _data(40), deadline=10.6, clock=clock).steps == 1  # without it the first step goes


def test_a_shortened_last_step_is_adamw_on_the_sequences_it_took():
    """The deadline's shortened step trains on the next whole micro-batches of the assignment, exactly as a
    step with that batch would: a plain AdamW step on sequences [8, 10) after two full steps."""
    hp = _hp(steps_max=8, warmup_steps=0)
    model = build_model(hp.model, 3)
    reference = copy.deepcopy(model)
    loop = InnerLoop(model, hp)
    loop.start()
    clock = StepClock(loop)
    data = _data(40, seed=5)
    r = loop.train(0, data, deadline=2.6, clock=clock)
    assert (r.steps, r.sequences, r.stopped) == (3, 10, "deadline")
    twin = InnerLoop(reference, hp)
    twin.start()
    for rows in (data[0:4], data[4:8], data[8:10]):
        twin._step(rows, hp.inner.lr)
    for (n, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q), n


def test_a_step_that_runs_past_the_deadline_ends_at_the_next_micro_batch():
    """The machine slowed down mid-step: the first micro-batch ends after the deadline, so the step is taken on
    the sequences seen (their mean gradient) — exactly a plain step on sequences [0, 2) — and the call stops."""
    hp = _hp(steps_max=8, warmup_steps=0)                 # batch 4, micro-batches of 2
    model = build_model(hp.model, 3)
    reference = copy.deepcopy(model)
    loop = InnerLoop(model, hp)
    loop.start()
    now = [0.0]
    forward = model.loss

    def slow_loss(part):                                   # every micro-batch takes 1 s: a step takes 2
        now[0] += 1.0
        return forward(part)
    model.loss = slow_loss
    data = _data(40, seed=7)
    r = loop.train(0, data, deadline=0.5, clock=lambda: now[0], step_seconds=0.4)  # predicted to fit
    assert (r.steps, r.sequences, r.stopped) == (1, 2, "deadline")
    twin = InnerLoop(reference, hp)
    twin.start()
    loss, used = twin._step(data[0:2], hp.inner.lr)
    assert used == 2 and r.losses[0] == pytest.approx(loss, rel=1e-6)
    for (n, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q), n                       # the rescale by 4/2 is exact
    now[0] = 0.0                                           # no deadline: the whole batch, as before
    assert loop._step(data[4:8], hp.inner.lr, lambda: True)[1] == 2
    assert loop._step(data[4:8], hp.inner.lr)[1] == 4


def test_fitting_batch():
    loop = InnerLoop(build_model(_hp().model, 1), _hp())
    assert loop.fitting_batch(4.0, 0.25, 16) == 16    # a full step of 16 at 0.25 s per sequence fits exactly
    assert loop.fitting_batch(3.9, 0.25, 16) == 12    # three quarters of it fit
    assert loop.fitting_batch(1.0, 0.25, 16) == 4     # one quarter
    assert loop.fitting_batch(0.9, 0.25, 16) == 0     # not even one
    assert loop.fitting_batch(0.0, 0.0, 16) == 16     # unknown speed, deadline not passed: a full step
    assert loop.fitting_batch(-0.1, 0.0, 16) == 0     # deadline passed
    assert loop.fitting_batch(0.3, 0.25, 3) == 1      # batches under 4 shorten by single sequences


def test_rebase_keeps_every_step():
    hp = _hp(steps_max=2)
    loop = InnerLoop(build_model(hp.model, 1), hp)
    theta_t = _params(loop.model)
    loop.start(theta_t)
    loop.train(0, _data(8, seed=1))
    loop.start(None)  # window t+1 begins from the local weights, before θ_{t+1} is known
    anchor = _params(loop.model)
    loop.train(1, _data(8, seed=2), max_steps=1)
    early = loop.pseudo_gradient()
    assert all(float(early[n].abs().max()) > 0 for n in early)
    g = torch.Generator().manual_seed(5)
    theta_next = {n: t + 1e-2 * torch.randn(t.shape, generator=g) for n, t in theta_t.items()}
    before = _params(loop.model)
    loop.rebase(theta_next)
    for n, p in loop.model.named_parameters():
        assert torch.equal(loop.anchor[n], theta_next[n])
        # local − anchor is kept: exactly, up to the one float32 rounding of the new weights
        moved = (before[n].double() - anchor[n].double())
        assert torch.allclose(p.detach().double() - theta_next[n].double(), moved, rtol=0,
                              atol=float(p.detach().abs().max()) * 2 ** -23)
        assert torch.allclose(loop.pseudo_gradient()[n], early[n], rtol=1e-4, atol=1e-6)
    loop.train(1, _data(8, seed=2)[4:], max_steps=1)  # the rest of window t+1, after the rebase
    assert loop.step_count == 4


def test_rebase_local_is_rebase_onto_the_model_s_theta_bit_for_bit():
    hp = _hp(steps_max=2)
    loops = [InnerLoop(build_model(hp.model, 1), hp) for _ in range(2)]
    g = torch.Generator().manual_seed(6)
    theta_next = {n: t + 1e-2 * torch.randn(t.shape, generator=g) for n, t in _params(loops[0].model).items()}
    for loop in loops:
        loop.start(None)
        loop.train(0, _data(8, seed=3), max_steps=1)
    local = loops[0].local_weights()
    loops[0].set_weights(theta_next)  # the bundle applied to the model's θ_t
    loops[0].rebase_local(local)
    loops[1].rebase(theta_next)
    for (n, p), q in zip(loops[0].model.named_parameters(), loops[1].model.parameters(), strict=True):
        assert torch.equal(p, q) and torch.equal(loops[0].anchor[n], loops[1].anchor[n])
        assert torch.equal(loops[0].anchor[n], theta_next[n]) and not torch.equal(p, theta_next[n])


def test_optimizer_state_persists_or_resets():
    for persist in (True, False):
        hp = _hp(steps_max=1, persist_state=persist)
        loop = InnerLoop(build_model(hp.model, 1), hp)
        loop.start()
        loop.train(0, _data(4))
        loop.start()
        assert bool(loop.optimizer.state) == persist
        assert loop.step_count == 1  # the warm-up counter always persists


def test_state_round_trip_through_safetensors_continues_identically():
    hp = _hp(steps_max=2)
    model = build_model(hp.model, 1)
    a = InnerLoop(model, hp)
    a.start()
    a.train(0, _data(8))
    blob = safetensors.torch.save(a.state())
    b = InnerLoop(copy.deepcopy(model), hp)
    assert b.load_state(safetensors.torch.load(blob))
    assert b.step_count == a.step_count == 2
    for loop in (a, b):
        loop.start()
        loop.train(1, _data(8, seed=3))
    for (n, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters(), strict=True):
        assert torch.equal(p, q), n


def test_load_state_rejects_what_it_cannot_use():
    hp = _hp(steps_max=1)
    loop = InnerLoop(build_model(hp.model, 1), hp)
    loop.start()
    loop.train(0, _data(4))
    good = loop.state()
    fresh = InnerLoop(build_model(hp.model, 1), hp)
    name = next(k for k in good if k.endswith(".exp_avg"))
    for broken in ({**good, name: torch.full_like(good[name], math.nan)},
                   {**good, name: torch.zeros(3)},
                   {k: v for k, v in good.items() if k != name},
                   {**good, "inner.step_count": torch.tensor([1.5])},
                   {**good, "inner.opt.unknown.exp_avg": torch.zeros(1)}):
        assert not fresh.load_state(broken)
        assert fresh.step_count == 0 and not fresh.optimizer.state
    assert fresh.load_state({"inner.step_count": torch.tensor([7])})  # counter only: fresh moments
    assert fresh.step_count == 7 and not fresh.optimizer.state


def test_gradient_mode_sends_the_gradient_and_does_not_move():
    hp = _hp(mode="gradient")
    model = build_model(hp.model, 1)
    loop = InnerLoop(model, hp)
    theta = _params(model)
    loop.start(theta)
    assert all(torch.count_nonzero(g) == 0 for g in loop.pseudo_gradient().values())
    data = _data(12)
    r = loop.train(0, data)
    assert (r.steps, r.sequences) == (1, 4)
    want, _ = compute_gradients(copy.deepcopy(model), data[:4], hp.micro_batch)
    for n, p in model.named_parameters():
        assert torch.equal(p, theta[n])
        assert torch.equal(loop.pseudo_gradient()[n], want[n])


def test_non_finite_loss_stops_without_moving():
    hp = _hp(steps_max=3)
    model = build_model(hp.model, 1)
    with torch.no_grad():
        model.embed.weight[0, 0] = math.inf
    loop = InnerLoop(model, hp)
    loop.start()
    before = _params(model)
    r = loop.train(0, torch.zeros(12, 17, dtype=torch.int64))
    assert (r.steps, r.stopped) == (0, "non_finite")
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n])
