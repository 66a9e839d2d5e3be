"""The miner trains window t+1 while the leader's bundle of window t is on its way (neurons/miner.py).

A miner with a stand-in context (no chain, no S3): the follower's bundle is "published" after a number
of looks, and applying it adds a known Δ to θ_t.  Checks: the miner keeps taking inner steps while the
bundle is pending; when it arrives the model's local weights are θ_{t+1} + (local − θ_t) and the anchor is
θ_{t+1}; window t+1 then goes on from there up to steps_max in all; without a bundle the model is θ_t again.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from dso.codec.codecs import make_codec
from dso.config.schema import Config, ModelConfig
from dso.data.assignment import Assignment
from dso.nn.model import build_model, parameter_shapes, state_hash
from dso.protocol.clock import PutWindow
from dso.training.outer import OuterState
from neurons.context import NodeContext
from neurons.miner import Miner

torch.set_num_threads(1)
PUBLISHED = "bundle"


class Follower:
    """Publishes the bundle of window t after ``after`` looks; applying it moves θ_t by ``delta``: an outer step
    of the miner's θ (neurons/theta.py) under the run's rule, plain SGD at lr 1 (make_miner), with Δ = −delta,
    so θ_t − 1·(−delta) = θ_t + delta exactly."""

    def __init__(self, theta, delta, after: int, hp):
        self.theta, self.delta, self.after, self.looks, self.applied = theta, delta, after, 0, 0
        self.hp = hp

    def arrived(self, t: int):
        self.looks += 1
        return PUBLISHED if self.looks > self.after else None

    def bundle(self, t: int, until: float):  # waits for it: published unless the wait is over
        self.looks = max(self.looks, self.after + 1) if until > time.time() else self.looks
        return PUBLISHED if self.looks > self.after else "missing"

    @torch.no_grad()
    def apply(self, t: int, got):
        if got != PUBLISHED:
            return False, "no bundle"
        self.theta.step({n: -d for n, d in self.delta.items()}, OuterState(), self.hp, t)
        self.applied += 1
        return True, "applied"


class Clock:
    """Every put window closes far in the future: only steps_max and the bundle bound training."""

    def put_window(self, t: int) -> PutWindow:
        return PutWindow(t, time.time() + 3600, time.time() + 3603)


class Dataset:
    data_hash = "d" * 64

    def training_batch(self, uid: int, t: int, assigned: int, n: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(1000 + t)
        return torch.randint(0, 256, (min(assigned, n), 17), generator=g)

    def assignment(self, uid: int, t: int, assigned: int, n: int, ahead: int, next_ahead: int = 0) -> Assignment:
        return Assignment.of(self.training_batch(uid, t, assigned, n))

    def target_bytes(self, batch: torch.Tensor) -> int:
        return int(batch[:, 1:].numel())


class Context(SimpleNamespace):
    """The parts of a NodeContext the miner reads, with its θ as a real node derives it."""
    ranked_theta = None
    theta = NodeContext.theta


def make_miner(tmp_path, after: int, steps_max: int = 5, step_sequences: int = 0):
    cfg = Config()
    cfg.neuron.step_sequences = step_sequences
    hp = cfg.hparams
    hp.tokenizer, hp.model = "bytes", ModelConfig(vocab_size=256, d_model=32, n_layers=1, n_heads=2, ffn_hidden=64,
                                                  seq_len=16)
    hp.batch_size, hp.micro_batch, hp.chunk, hp.topk = 4, 4, 16, 8
    hp.inner.steps_max, hp.assigned_sequences, hp.inner.warmup_steps = steps_max, 4 * steps_max, 0
    hp.outer.rule, hp.outer.lr = "sgd", 1.0  # the stand-in bundle's step adds its delta exactly (Follower)
    model = build_model(hp.model, hp.seed)
    codec = make_codec(parameter_shapes(model), hp)
    ctx = Context(cfg=cfg, hp=hp, model=model, codec=codec, shapes=codec.shapes,
                  device=torch.device("cpu"), state_dir=tmp_path, dataset=Dataset(), clock=Clock(), uid=3,
                  stop=lambda: False, wait_randomness=lambda t: bytes([t]) * 32)
    miner = Miner(ctx)
    g = torch.Generator().manual_seed(7)
    delta = {n: 1e-2 * torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
    miner.follower = Follower(miner.theta, delta, after, hp)
    miner.model_window = 0
    return miner, delta


def params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_training_goes_on_while_the_bundle_is_pending_and_is_rebased_onto_the_new_theta(tmp_path):
    miner, delta = make_miner(tmp_path, after=3)
    theta_t = params(miner.ctx.model)
    seen = {}
    rebase = miner.inner.rebase_local

    def spy(local):  # the local weights just before the rebase
        seen.update({n: w.clone() for n, w in local.items()})
        rebase(local)
    miner.inner.rebase_local = spy

    applied, summary = miner.train_ahead(0, until=time.time() + 60)
    assert applied and miner.follower.applied == 1
    assert miner.ahead is not None and (miner.ahead.window, miner.ahead.report.steps) == (1, 3)  # 3 looks: 3 steps
    assert miner.ahead.report.stopped == "interrupted" and "3 steps of window 1" in summary
    assert miner.theta_hash() == state_hash((n, theta_t[n] + delta[n]) for n in theta_t)  # what the record says
    for n, p in miner.ctx.model.named_parameters():
        theta_next = theta_t[n] + delta[n]
        assert torch.equal(miner.inner.anchor[n], theta_next)
        assert float((seen[n] - theta_t[n]).abs().max()) > 0  # the steps moved the weights
        expected = theta_next.double() + (seen[n].double() - theta_t[n].double())
        assert torch.allclose(p.detach().double(), expected, rtol=0, atol=float(expected.abs().max()) * 2 ** -23)

    # window 1 goes on from the rebased weights, up to steps_max in all, on the rest of its assignment
    steps_before = miner.inner.step_count
    own, loss = miner.train(1)
    assert own is not None and loss == loss
    assert (miner.report.steps, miner.ahead_steps, miner.report.sequences) == (5, 3, 20)
    assert miner.inner.step_count == steps_before + 2 and miner.ahead is None
    for n, p in miner.ctx.model.named_parameters():  # back at θ_1 for the upload and the next bundle
        assert torch.equal(p.detach(), theta_t[n] + delta[n])


def test_without_a_bundle_the_steps_are_dropped_and_the_model_is_theta_t(tmp_path):
    miner, _ = make_miner(tmp_path, after=10 ** 9)
    theta_t = params(miner.ctx.model)
    applied, _ = miner.train_ahead(0, until=time.time() - 1)  # the wait is over before it begins
    assert not applied and miner.ahead is None
    assert all(torch.equal(p.detach(), theta_t[n]) for n, p in miner.ctx.model.named_parameters())


def test_training_ahead_stops_at_steps_max_and_then_waits_for_the_bundle(tmp_path):
    miner, _ = make_miner(tmp_path, after=8, steps_max=5)
    applied, _ = miner.train_ahead(0, until=time.time() + 60)
    assert applied and miner.ahead is not None and miner.ahead.report.steps == 5
    miner.train(1)
    assert (miner.report.steps, miner.ahead_steps) == (5, 5)  # nothing left to take after θ_1 arrived


def test_paper_mode_does_not_train_ahead(tmp_path):
    miner, _ = make_miner(tmp_path, after=0)
    miner.ctx.hp.inner.mode = "gradient"
    assert not miner.trains_ahead(1)
    miner.ctx.hp.inner.mode = "steps"
    assert miner.trains_ahead(1)
    miner.privacy.stopped = True
    assert not miner.trains_ahead(1)


class ClosingClock:
    """Window t's put window closes ``left`` seconds from now."""

    def __init__(self, left: float):
        self.left = left

    def put_window(self, t: int) -> PutWindow:
        return PutWindow(t, time.time() - 5, time.time() + self.left)


def test_a_late_miner_takes_one_step_only_if_it_can_still_upload_it(tmp_path):
    miner, _ = make_miner(tmp_path, after=0)
    theta = params(miner.ctx.model)
    miner.step_seconds = 3.0        # the last window's steps took this long
    miner.encode_seconds = 30.0     # and its upload: the training deadline has passed in both cases below
    miner.ctx.clock = ClosingClock(left=1.0)
    own, loss = miner.train(0)      # a step would end after the close: not taken, nothing to upload
    assert own is None and loss != loss and miner.inner.step_count == 0
    assert all(torch.equal(p.detach(), theta[n]) for n, p in miner.ctx.model.named_parameters())
    miner.ctx.clock = ClosingClock(left=10.0)
    own, _ = miner.train(0)         # there is time for one: one step beats a zero update
    assert own is not None and miner.report.steps == 1 and miner.inner.step_count == 1


def test_a_miner_whose_theta_came_late_finishes_that_window_while_its_put_window_allows(tmp_path):
    miner, _ = make_miner(tmp_path, after=0)
    miner.model_window, miner.encode_seconds = 4, 1.0   # θ_4 arrived once window 5 had begun
    miner.ctx.clock = ClosingClock(left=5.0)
    assert miner.finishes_previous(5)                    # put window 4 closes in 5 s: finish window 4
    assert not miner.finishes_previous(6)                # only the window just before
    miner.ctx.clock = ClosingClock(left=1.2)
    assert not miner.finishes_previous(5)                # 1 s to encode + the margin no longer fit
    miner.ctx.clock = ClosingClock(left=5.0)
    miner.worked = 4
    assert not miner.finishes_previous(5)                # window 4 was already uploaded: never twice


def test_a_miner_with_more_compute_takes_larger_steps_with_step_sequences(tmp_path):
    """--neuron.step_sequences 8 (twice batch_size 4): steps of 8 sequences, up to steps_max or the assignment (20)."""
    miner, _ = make_miner(tmp_path, after=0, step_sequences=8)
    assert (miner.step_batch, miner.sequences) == (8, 20)   # steps_max × 8 = 40 is capped by the assignment
    own, _ = miner.train(0)
    assert own is not None
    assert (miner.report.steps, miner.report.sequences, miner.report.stopped) == (2, 16, "assignment")
    baseline, _ = make_miner(tmp_path / "baseline", after=0)
    baseline.train(0)
    assert (baseline.step_batch, baseline.report.steps, baseline.report.sequences) == (4, 5, 20)


def test_step_sequences_beyond_the_assignment_stops_the_miner_with_the_reason(tmp_path):
    from neurons.lifecycle import Fatal
    with pytest.raises(Fatal) as stopped:
        make_miner(tmp_path, after=0, step_sequences=21)
    assert "--neuron.step_sequences 21 exceeds the 20 sequences" in stopped.value.message


def test_a_step_that_overran_the_deadline_widens_the_next_margin_also_when_the_upload_was_refused(tmp_path):
    miner, _ = make_miner(tmp_path, after=0)
    miner.ctx.clock = ClosingClock(left=30.0)
    miner.encode_seconds = 30.0 - 2.0 - 0.5      # the deadline is 2 s from now (UPLOAD_MARGIN 0.5)
    deadline = miner.deadline(0)
    own, _ = miner.train(0)
    assert own is not None and miner.margin_from == pytest.approx(min(miner.trained_at, deadline))
    began = time.time()
    miner.margin_from = began - 2.0                # as if the last step had overrun the deadline by 2 s
    miner.ctx.clock = ClosingClock(left=0.1)       # and the put window now closes: the upload is refused
    assert not miner.upload(0, own, miner.ctx.clock.put_window(0))
    # the overrun + ENCODE_MARGIN + the signature's lead the upload would still have taken, plus however long the
    # refused upload took (a loaded machine may take a while)
    lead = miner.signature_lead()
    assert lead > 0 and 2.0 + 0.5 + lead <= miner.encode_seconds <= 2.0 + 0.5 + lead + (time.time() - began)
