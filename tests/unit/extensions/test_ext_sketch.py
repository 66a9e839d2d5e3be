"""Sketch codec: fast JL projection, stochastic quantisation, wire format, error feedback."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.linalg import hadamard

from dso.codec.codecs import make_codec
from dso.codec.demo import DeMoCodec, ErrorFeedback
from dso.codec.packing import PackingError
from dso.codec.sketch import SketchCodec, dequantise, fwht, stochastic_quantise
from dso.config.schema import HParams
from dso.protocol.rejections import Reason

torch.set_num_threads(1)

SHAPES = {"emb": (64, 32), "ffn": (24, 40), "norm": (32,), "odd": (3, 5)}


def codec(**kw) -> SketchCodec:
    args = dict(dim=256, clip=1e9, bits=32, seed=11)
    args.update(kw)
    return SketchCodec(SHAPES, **args)


def grads(seed=0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=gen) for n, s in SHAPES.items()}


def dense_matrix(c: SketchCodec, name: str, window: int = 0) -> torch.Tensor:
    """S built column by column from the codec's own projection (test oracle only)."""
    n = math.prod(SHAPES[name])
    eye = torch.eye(n)
    return torch.stack([c.project(name, eye[i].reshape(SHAPES[name]), window) for i in range(n)], dim=1)


def test_fwht_is_the_orthonormal_sylvester_hadamard():
    for n in (1, 2, 8, 64):
        x = torch.randn(3, n, dtype=torch.float64)
        H = torch.from_numpy(hadamard(n)).double() / math.sqrt(n)
        assert torch.allclose(fwht(x), x @ H.T, atol=1e-12)
        assert torch.allclose(fwht(fwht(x)), x, atol=1e-12)
    with pytest.raises(ValueError):
        fwht(torch.zeros(6))


def test_projection_is_deterministic_per_seed_name_and_window():
    a, b = codec(), codec()
    assert torch.equal(a.projection("emb", 0).signs, b.projection("emb", 0).signs)
    assert torch.equal(a.projection("emb", 0).rows, b.projection("emb", 0).rows)
    assert not torch.equal(a.projection("emb", 0).rows, a.projection("emb", 1).rows)
    assert not torch.equal(a.projection("emb", 0).signs, codec(seed=12).projection("emb", 0).signs)
    rows = a.projection("emb", 0).rows
    assert rows.numel() == 256 and len(set(rows.tolist())) == 256 and bool((rows < 2048).all())
    assert torch.equal(rows, rows.sort().values)


def test_sketch_rows_are_orthogonal_and_decode_is_the_pseudo_inverse():
    c = codec()
    S = dense_matrix(c, "emb").double()  # p = P = 2048, d = 256
    P, d = 2048, 256
    assert torch.allclose(S @ S.T, (P / d) * torch.eye(d, dtype=torch.float64), atol=1e-4)
    y = torch.randn(d)
    x_hat = c.transpose("emb", y, 0)
    assert torch.allclose(x_hat.reshape(-1).double(), (d / P) * S.T @ y.double(), atol=1e-5)
    assert torch.allclose(x_hat.reshape(-1).double(), torch.linalg.pinv(S) @ y.double(), atol=1e-5)
    assert torch.allclose(c.project("emb", x_hat, 0), y, atol=1e-4)  # S S⁺ = I


def test_padded_tensor_decode_is_a_contraction():
    # ffn has p = 960 values padded to P = 1024: decode∘encode = (d/P)·S_pᵀS_p has eigenvalues in [0, 1]
    c = codec()
    S = dense_matrix(c, "ffn").double()
    eig = torch.linalg.eigvalsh((256 / 1024) * S.T @ S)
    assert float(eig.min()) > -1e-6 and float(eig.max()) < 1 + 1e-6


def test_full_dimension_reconstructs_exactly():
    c = codec(dim=4096)
    g = grads()
    for name in SHAPES:
        back = c.to_dense(name, c.compress_tensor(name, g[name], 0))
        assert torch.allclose(back, g[name], atol=1e-5), name


def test_johnson_lindenstrauss_norms_and_inner_products():
    c = SketchCodec({"w": (128, 128)}, dim=2048, clip=1e9, bits=32, seed=5)
    gen = torch.Generator().manual_seed(9)
    x, z = torch.randn(128, 128, generator=gen), torch.randn(128, 128, generator=gen)
    ratios = []
    for window in range(20):
        y = c.project("w", x, window)
        ratios.append(float(y.norm() / x.norm()))
        assert float((y @ c.project("w", z, window)) / (x.norm() * z.norm())) == pytest.approx(0.0, abs=0.15)
    assert np.mean(ratios) == pytest.approx(1.0, abs=0.02) and max(abs(r - 1) for r in ratios) < 0.1


def test_cosine_of_decode_is_about_sqrt_d_over_p():
    c = SketchCodec({"w": (256, 256)}, dim=1024, clip=1e9, bits=32, seed=1)
    x = torch.randn(256, 256, generator=torch.Generator().manual_seed(2))
    x_hat = c.to_dense("w", c.compress_tensor("w", x, 0))
    cos = float((x_hat * x).sum() / (x_hat.norm() * x.norm()))
    assert cos == pytest.approx(math.sqrt(1024 / 65536), rel=0.1)


def test_stochastic_quantisation_is_unbiased_and_on_the_grid():
    y = torch.tensor([-1.0, -0.33, 0.0, 0.2, 0.71, 1.0])
    gen = torch.Generator().manual_seed(0)
    draws = []
    for _ in range(4000):
        codes, scale = stochastic_quantise(y, 4, gen)
        assert scale.item() == 1.0 and int(codes.max()) <= 15
        draws.append(dequantise(codes, scale, 4))
    vals = torch.stack(draws)
    grid = torch.linspace(-1, 1, 16)
    assert bool(torch.isclose(vals[..., None], grid, atol=1e-6).any(-1).all())
    assert torch.allclose(vals.mean(0), y, atol=0.01)
    assert vals[:, 0].eq(-1).all() and vals[:, -1].eq(1).all()  # extremes are exact
    codes, scale = stochastic_quantise(torch.zeros(4), 4, gen)
    assert scale.item() == 0 and codes.sum() == 0


def test_clip_and_noise_in_sketch_space():
    c = codec(clip=0.5)
    u = c.compress_tensor("emb", grads()["emb"], 0)
    assert float(c.values(u).norm()) == pytest.approx(0.5, rel=1e-5)
    noisy = codec(clip=0.5, noise_std=0.1)
    gen = torch.Generator().manual_seed(0)
    diff = noisy.values(noisy.compress_tensor("emb", grads()["emb"], 0, generator=gen)) - c.values(u)
    assert float(diff.std()) == pytest.approx(0.1, rel=0.15)


def test_compress_is_deterministic_given_the_generator_or_window_seed():
    c = codec(bits=4)
    g = grads()
    u1 = c.compress(g, 0, generator=torch.Generator().manual_seed(4))
    u2 = c.compress(g, 0, generator=torch.Generator().manual_seed(4))
    assert all(torch.equal(u1[n].codes, u2[n].codes) for n in SHAPES)
    v1, v2 = c.compress(g, 3, uid=7), c.compress(g, 3, uid=7)
    assert all(torch.equal(v1[n].codes, v2[n].codes) and v1[n].window == 3 for n in SHAPES)
    other = c.compress(g, 3, uid=8)  # another sender rounds with other randomness
    assert not all(torch.equal(v1[n].codes, other[n].codes) for n in SHAPES)


@pytest.mark.parametrize("bits", [2, 4, 8, 32])
def test_wire_round_trip_matches_spec(bits):
    c = codec(bits=bits)
    update = c.compress(grads(), 5)
    wire = c.to_wire(update)
    spec = c.wire_spec()
    assert set(wire) == set(spec)
    for key, (dtype, shape) in spec.items():
        assert wire[key].dtype == np.dtype(dtype) and wire[key].shape == shape, key
    assert c.payload_bytes() == sum(a.nbytes for a in wire.values())
    back = c.from_wire(wire, 5)
    for n in SHAPES:
        assert torch.equal(c.to_dense(n, back[n]), c.to_dense(n, update[n]))
        assert back[n].window == 5
    assert c.kept() == 256 + 256 + 32 + 16


def test_from_wire_rejects_bad_content():
    c = codec(bits=4)
    wire = c.to_wire(c.compress(grads(), 0))
    for value, reason in ((np.array([np.nan], np.float32), Reason.NON_FINITE),
                          (np.array([-1.0], np.float32), Reason.BAD_ENCODING)):
        bad = dict(wire, **{"emb.scale": value})
        with pytest.raises(PackingError) as err:
            c.from_wire(bad, 0)
        assert err.value.reason == reason.value
    bad = dict(wire, **{"emb.scale": np.array([0.0], np.float32)})
    with pytest.raises(PackingError, match="zero scale"):
        c.from_wire(bad, 0)
    bad = dict(wire, **{"emb.val": wire["emb.val"][:-1]})
    with pytest.raises(PackingError) as err:
        c.from_wire(bad, 0)
    assert err.value.reason == Reason.BAD_SHAPE.value
    c32 = codec(bits=32)
    wire32 = c32.to_wire(c32.compress(grads(), 0))
    wire32["norm.val"] = wire32["norm.val"].copy()
    wire32["norm.val"][0] = np.inf
    with pytest.raises(PackingError) as err:
        c32.from_wire(wire32, 0)
    assert err.value.reason == Reason.NON_FINITE.value


def test_mean_delta_is_scale_free_and_linear():
    c = codec()
    g1, g2 = grads(1), grads(2)
    u1, u2 = c.compress(g1, 0), c.compress({n: 1000 * t for n, t in g2.items()}, 0)
    u2_small = c.compress(g2, 0)
    m = c.mean_delta([u1, u2])
    m_small = c.mean_delta([u1, u2_small])
    for n in SHAPES:
        assert torch.allclose(m[n], m_small[n], atol=1e-5)  # ×1000 counts the same
        y = (c.normalised_values(u1[n]) + c.normalised_values(u2_small[n])) / 2
        assert torch.allclose(m[n], c.transpose(n, y, 0), atol=1e-6)
    zero = c.mean_delta([])
    assert all(float(t.abs().sum()) == 0 for t in zero.values())


def test_error_feedback_is_stable_and_delivers_over_rotating_windows():
    c = SketchCodec({"w": (64, 64)}, dim=256, clip=1e9, bits=32, seed=3)  # 1/16 of the space per window
    ef = ErrorFeedback(c, beta=1.0)
    g = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    sent = torch.zeros_like(g)
    cosines = []
    for window in range(60):
        update = ef.step({"w": g if window == 0 else torch.zeros_like(g)}, window)
        sent += c.to_dense("w", update["w"])
        cosines.append(float((sent * g).sum() / (sent.norm() * g.norm())))
        assert float(ef.buffers["w"].norm()) <= float(g.norm()) * (1 + 1e-5)  # residual never grows
    # a single gradient is delivered progressively as the subspace rotates
    assert cosines[0] == pytest.approx(0.25, abs=0.05) and cosines[-1] > 0.97
    assert torch.allclose(sent + ef.buffers["w"], g, atol=1e-4)  # sent + residual = what went in


def test_from_hparams_and_settings():
    hp = HParams()
    c = SketchCodec.from_hparams(SHAPES, hp)
    assert c.settings() == {"codec": "sketch", "sketch_dim": str(hp.sketch_dim), "sketch_clip": repr(hp.sketch_clip),
                            "value_bits": str(hp.value_bits), "sketch_seed": str(hp.seed)}
    with pytest.raises(ValueError):
        SketchCodec(SHAPES, bits=9)
    hp.codec = "sketch"
    assert isinstance(make_codec(SHAPES, hp), SketchCodec)
    hp.codec = "demo"
    assert isinstance(make_codec(SHAPES, hp), DeMoCodec)
