import torch

from dso.aggregation.signed import aggregate_signs, signed_step
from dso.codec.demo import DeMoCodec
from dso.config.schema import HParams, ModelConfig
from dso.nn.model import build_model, parameter_shapes


def _codec():
    return DeMoCodec({"a": (64, 64), "b": (64,)}, chunk=32, topk=16, value_bits=4)


def _grads(seed):
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(64, 64, generator=g), "b": torch.randn(64, generator=g)}


def test_identical_updates_aggregate_to_the_sign_of_that_update():
    codec = _codec()
    u = codec.compress(_grads(0), 0)
    agg = aggregate_signs(codec, [u, u, u], HParams())[0]
    for n in u:
        assert torch.equal(agg[n], torch.sign(codec.to_dense(n, u[n])))


def test_l2_normalisation_makes_scaling_irrelevant():
    codec = _codec()
    honest = [codec.compress(_grads(s), 0) for s in range(3)]
    scaled = codec.compress({n: 1000 * t for n, t in _grads(9).items()}, 0)
    plain = codec.compress(_grads(9), 0)
    a = aggregate_signs(codec, honest + [scaled], HParams())[0]
    b = aggregate_signs(codec, honest + [plain], HParams())[0]
    for n in a:
        assert torch.equal(a[n], b[n])
    # without normalisation the scaled peer would dictate the sign everywhere it has mass
    dominated = torch.sign(codec.to_dense("a", scaled["a"]))
    assert not torch.equal(a["a"], dominated)


def test_no_updates_means_no_step():
    codec = _codec()
    agg, _ = aggregate_signs(codec, [], HParams())
    assert all(torch.count_nonzero(t) == 0 for t in agg.values())


def test_signed_step_moves_every_parameter_by_lr():
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=2, ffn_hidden=64, seq_len=8)
    model = build_model(cfg, 0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    sign = {n: torch.where(torch.rand(s) > 0.5, 1.0, -1.0) for n, s in parameter_shapes(model).items()}
    signed_step(model, sign, lr=0.01)
    for n, p in model.named_parameters():
        assert torch.allclose(before[n] - p.detach(), 0.01 * sign[n], atol=1e-6)
