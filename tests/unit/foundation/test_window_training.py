"""One window of a miner's training (dso/training/window_training.py): start, train, release, error feedback, back to
θ_t."""
import copy

import torch

from dso.codec.codecs import make_codec
from dso.codec.demo import ErrorFeedback
from dso.config.schema import HParams, ModelConfig
from dso.nn.model import build_model, parameter_shapes
from dso.training.inner import InnerLoop
from dso.training.window_training import Start, train_window

torch.set_num_threads(1)


def _hp() -> HParams:
    hp = HParams()
    hp.model = ModelConfig(d_model=32, n_layers=1, n_heads=2, ffn_hidden=64, seq_len=16)
    hp.batch_size, hp.micro_batch, hp.chunk, hp.topk = 4, 2, 16, 4
    hp.inner.steps_max = 3
    return hp


def _data(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n, 17), generator=torch.Generator().manual_seed(seed))


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _parts(hp: HParams):
    model = build_model(hp.model, 0)
    codec = make_codec(parameter_shapes(model), hp)
    return InnerLoop(model, hp), ErrorFeedback(codec, hp.ef_beta), codec


def test_a_window_sends_the_compressed_pseudo_gradient_and_ends_at_theta():
    hp = _hp()
    loop, feedback, codec = _parts(hp)
    theta = {n: t + 0.01 for n, t in _params(loop.model).items()}  # θ_t differs from what the model held
    data = _data(8)
    twin, twin_feedback = copy.deepcopy(loop), ErrorFeedback(codec, hp.ef_beta)
    released: list[float] = []

    def release(grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        released.append(sum(float(g.abs().sum()) for g in grads.values()))
        return {n: g / 2 for n, g in grads.items()}

    done = train_window(loop, feedback, 5, 7, lambda lp: lp.train(5, data, max_steps=2), start=Start(theta),
                        release=release)
    # the same sequence written out by hand
    twin.start(theta)
    report = twin.train(5, data, max_steps=2)
    expected = twin_feedback.step({n: g / 2 for n, g in twin.pseudo_gradient().items()}, 5, 7)
    assert done.report.steps == report.steps == 2 and done.report.losses == report.losses
    assert len(released) == 1 and released[0] > 0
    dense, want = codec.decompress(done.update), codec.decompress(expected)
    assert all(torch.equal(dense[n], want[n]) for n in want)
    assert all(torch.equal(feedback.buffers[n], twin_feedback.buffers[n]) for n in want)
    assert all(torch.equal(p, theta[n]) for n, p in _params(loop.model).items())  # back at θ_t
    assert done.state is None  # the loop kept its own optimiser state


def test_nothing_to_send_leaves_the_feedback_alone_and_the_model_at_theta():
    hp = _hp()
    loop, feedback, _ = _parts(hp)
    theta = _params(loop.model)

    def one_step_then_give_up(lp: InnerLoop) -> None:
        lp.train(0, _data(4), max_steps=1)
        return None

    done = train_window(loop, feedback, 0, 1, one_step_then_give_up)
    assert done.update is None and done.report.steps == 0
    assert all(float(b.abs().sum()) == 0 for b in feedback.buffers.values())
    assert all(torch.equal(p, theta[n]) for n, p in _params(loop.model).items())


def test_steps_taken_ahead_are_rebased_onto_theta():
    hp = _hp()
    loop, feedback, _ = _parts(hp)
    old = _params(loop.model)
    loop.start(None)
    loop.train(0, _data(4, seed=1), max_steps=1)  # a step of the next window, from θ_{t-1}
    moved = {n: p - old[n] for n, p in _params(loop.model).items()}
    theta = {n: t + 0.5 for n, t in old.items()}
    seen: dict[str, torch.Tensor] = {}

    def look(lp: InnerLoop):
        seen.update(_params(lp.model))
        return lp.train(1, _data(4), max_steps=0)

    train_window(loop, feedback, 1, 1, look, start=Start(theta, ahead=True))
    for n, p in seen.items():  # local = θ_t + (local − θ_{t-1}), up to float32 rounding
        assert torch.allclose(p, theta[n] + moved[n], atol=1e-6)


def test_a_shared_loop_swaps_each_peers_optimiser_state():
    hp = _hp()
    loop, feedback, _ = _parts(hp)
    theta = _params(loop.model)

    def train(lp: InnerLoop):
        return lp.train(0, _data(8), max_steps=2)

    first = train_window(loop, feedback, 0, 1, train, start=Start(theta, state={}))
    assert first.state is not None and int(first.state["inner.step_count"][0]) == 2
    second = train_window(loop, feedback, 1, 1, train, start=Start(theta, state=first.state))
    assert second.state is not None and int(second.state["inner.step_count"][0]) == 4
    fresh = train_window(loop, feedback, 1, 2, train, start=Start(theta, state={}))  # another, new peer
    assert fresh.state is not None and int(fresh.state["inner.step_count"][0]) == 2
