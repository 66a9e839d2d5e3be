"""The miner's bundle apply off the training thread (neurons/background_apply.py): it works on copies."""
from __future__ import annotations

import torch

from dso.outer import OuterState
from neurons.background_apply import BackgroundApply


def _model() -> torch.nn.Module:
    return torch.nn.Linear(3, 2)


def test_applies_to_a_copy_of_theta_and_of_the_outer_state():
    own, scratch = _model(), _model()
    theta = {n: torch.full_like(p, 2.0) for n, p in own.named_parameters()}
    outer = OuterState()

    def apply(model, state, got):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        state.steps = 7
        return True, f"applied {got}"

    pending = BackgroundApply(scratch, apply)
    assert not pending.started and pending.result() == (False, "no bundle applied")
    pending.start("bundle", theta, outer)
    assert pending.result() == (True, "applied bundle") and pending.done()
    assert all(torch.equal(p, torch.full_like(p, 3.0)) for p in pending.theta_next().values())
    assert pending.outer is not None and pending.outer.steps == 7 and outer.steps != 7  # ours untouched
    assert not any(torch.equal(p, torch.full_like(p, 3.0)) for p in own.parameters())


def test_an_apply_that_raises_is_a_failed_apply_not_a_lost_thread():
    def apply(model, state, got):
        raise ValueError("bad bundle")

    pending = BackgroundApply(_model(), apply)
    pending.start("bundle", {n: p.detach() for n, p in _model().named_parameters()}, OuterState())
    applied, summary = pending.result()
    assert not applied and "ValueError: bad bundle" in summary
