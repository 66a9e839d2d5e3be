"""Outer step (dso/training/outer.py) and the machine-independent decode it relies on (dso/training/exact.py)."""
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from dso.aggregation.signed import aggregate_signs
from dso.codec.dct import ChunkPlan
from dso.codec.demo import DeMoCodec, TensorUpdate
from dso.config.schema import HParams
from dso.training.exact import BASIS_BITS, COEFF_BITS, basis_margin, exact_decode, exact_norm, fixed_basis
from dso.training.outer import (
    OuterState,
    aggregate,
    apply_outer,
    evaluation_step,
    median,
    outer_lr,
    peer_evaluation_step,
    peer_norms,
    reference_norms,
)
from repo import ROOT

SHAPES = {"a": (128, 192), "b": (70,), "c": (96, 130)}


def _codec(**kw):
    return DeMoCodec(SHAPES, chunk=64, topk=16, value_bits=4, **kw)


def _updates(codec, n, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [codec.compress({k: scale * torch.randn(s, generator=g) for k, s in SHAPES.items()}, 0) for _ in range(n)]


def _scaled(update, factor):
    """The same update with every level magnitude multiplied (what a scaling attacker sends)."""
    return {n: TensorUpdate(u.idx, u.codes, u.scale * factor) for n, u in update.items()}


def _hp(rule="sgd", **outer):
    hp = HParams()
    hp.outer.rule = rule
    for k, v in outer.items():
        setattr(hp.outer, k, v)
    return hp


# ------------------------------------------------------------------ exact
def test_exact_norm_is_the_l2_norm():
    v = torch.randn(10000) * 1e3
    assert exact_norm(v) == pytest.approx(float(np.linalg.norm(v.double().numpy())), rel=1e-15)
    assert exact_norm(torch.zeros(5)) == 0.0


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 48, 50, 64, 128, 512])
def test_fixed_basis_has_no_entry_near_a_rounding_boundary(n):
    """A libm that differs from ours in the last bits of cos cannot change a rounded basis entry."""
    assert basis_margin(n) > 1e-6
    import scipy.fft
    dense = scipy.fft.dct(np.eye(n), norm="ortho", axis=0)  # independent oracle of the DCT-II basis
    np.testing.assert_allclose(fixed_basis(n).numpy() / 2.0 ** BASIS_BITS, dense, atol=2.0 ** -BASIS_BITS)


@pytest.mark.parametrize("shape", [(128, 192), (70,), (257,), (96, 130), (4, 3, 5)])
def test_exact_decode_matches_the_float_decode(shape):
    plan = ChunkPlan.for_shape(shape, 64)
    coeffs = torch.randn(plan.n_chunks, plan.chunk_size, dtype=torch.float64)
    exact, ref = exact_decode(plan, coeffs), plan.decode(coeffs.float())
    assert exact.dtype == torch.float32 and exact.shape == shape
    assert float((exact - ref).abs().max()) <= 1e-5 * float(ref.abs().max())


def test_exact_decode_equals_integer_arithmetic():
    """Oracle: the same fixed-point algorithm in Python integers (no float rounding at all)."""
    plan = ChunkPlan.for_shape((96, 130), 64)
    coeffs = torch.randn(plan.n_chunks, plan.chunk_size, dtype=torch.float64) * 3e-3
    got = exact_decode(plan, coeffs)
    e = math.frexp(float(coeffs.abs().max()))[1]
    units = np.rint(coeffs.numpy() * 2.0 ** (COEFF_BITS - e)).astype(object)
    (gm, gn), (a, b) = plan.grid, plan.edges
    da, db = (fixed_basis(n).numpy().astype(np.int64).astype(object) for n in (a, b))
    blocks = units.reshape(gm, gn, a, b)
    rows = np.einsum("ui,xyuv->xyiv", da, blocks)
    rows = np.vectorize(lambda v: _round_half_even(v, BASIS_BITS))(rows)
    x = np.einsum("xyiv,vj->xyij", rows, db).transpose(0, 2, 1, 3).reshape(plan.padded)
    want = np.vectorize(lambda v: float(np.float32(math.ldexp(float(v), e - COEFF_BITS - BASIS_BITS))))(x)
    want = want[: plan.view[0], : plan.view[1]].astype(np.float32)
    assert np.array_equal(got.numpy(), want)


def _round_half_even(value: int, bits: int) -> int:
    q, r = divmod(value, 1 << bits)
    half = 1 << (bits - 1)
    return q + 1 if r > half or (r == half and q % 2) else q


def test_exact_decode_without_dct_is_the_scatter():
    plan = ChunkPlan.for_shape((96, 130), 64, transform=False)
    coeffs = torch.randn(plan.n_chunks, plan.chunk_size, dtype=torch.float64)
    assert torch.equal(exact_decode(plan, coeffs), plan.decode(coeffs.float()))


# -------------------------------------------------------------- aggregate
def test_median():
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0, 2.0, 3.0]) == 2.5 and median([]) == 0.0


def test_optimiser_rules_rescale_the_normalised_mean_by_the_median_norm():
    codec = _codec()
    ups = _updates(codec, 3) + _updates(codec, 1, seed=5, scale=3.0)
    agg = aggregate(codec, ups, _hp("sgd"))
    norms = [peer_norms(codec, u) for u in ups]
    dense = codec.mean_delta(ups)  # the Gauntlet's normalised mean (float path)
    for n in SHAPES:
        ref = median([p[n] for p in norms])
        assert agg.reference_norms[n] == pytest.approx(ref, rel=1e-12)
        assert torch.allclose(agg.delta[n], dense[n] * ref, atol=1e-5 * float(agg.delta[n].abs().max()))


def test_a_scaled_update_counts_as_one_peer():
    codec = _codec()
    honest = _updates(codec, 4)
    plain = _updates(codec, 1, seed=9)[0]
    scaled = _scaled(plain, 1000.0)
    hp = _hp("nesterov")
    with_scaled, with_plain = aggregate(codec, honest + [scaled], hp), aggregate(codec, honest + [plain], hp)
    honest_norms = [peer_norms(codec, u) for u in honest]
    for n in SHAPES:  # the median ignores the outlier: the step size stays within the honest norms
        ref = with_scaled.reference_norms[n]
        assert min(p[n] for p in honest_norms) <= ref <= max(p[n] for p in honest_norms)
        direction = with_plain.delta[n] / with_plain.reference_norms[n]  # and the direction is unchanged
        tol = 1e-6 * float(direction.abs().max())
        assert torch.allclose(with_scaled.delta[n] / ref, direction, rtol=1e-5, atol=tol)
    # a plain (un-normalised) mean would have been dominated by the scaled peer
    raw = sum(codec.decompress(u)["a"] for u in honest + [scaled]) / 5
    assert float(raw.norm()) > 50 * float(with_scaled.delta["a"].norm())


def test_signed_rule_is_the_sign_of_the_normalised_mean():
    codec = _codec()
    ups = _updates(codec, 4)
    agg = aggregate(codec, ups, _hp("signed"))
    old, _ = aggregate_signs(codec, ups, HParams())
    for n in SHAPES:
        assert set(agg.delta[n].unique().tolist()) <= {-1.0, 0.0, 1.0}
        assert float((agg.delta[n] != old[n]).float().mean()) < 1e-3  # only near-zero entries may differ


def test_no_updates_no_step():
    codec = _codec()
    for rule in ("signed", "sgd", "nesterov"):
        agg = aggregate(codec, [], _hp(rule))
        assert all(torch.count_nonzero(d) == 0 for d in agg.delta.values())


def test_robust_rules_keep_the_median_norm():
    codec = _codec()
    ups = _updates(codec, 5)
    hp = _hp("sgd")
    hp.aggregation = "median"
    agg = aggregate(codec, ups, hp, [3, 4, 5, 6, 7])
    assert agg.info.rule == "median"
    refs = reference_norms([peer_norms(codec, u) for u in ups], list(SHAPES))
    assert agg.reference_norms == refs


# ------------------------------------------------------------------ step
def test_sgd_and_nesterov_steps_against_a_numpy_oracle():
    codec = _codec()
    for rule in ("sgd", "nesterov"):
        hp = _hp(rule, lr=0.7, momentum=0.9)
        params = {n: torch.randn(s) for n, s in SHAPES.items()}
        want = {n: p.numpy().copy() for n, p in params.items()}
        m = {n: np.zeros(s, np.float32) for n, s in SHAPES.items()}
        state = OuterState.fresh(SHAPES, hp)
        for t in range(3):
            delta = aggregate(codec, _updates(codec, 3, seed=t), hp).delta
            apply_outer(params, delta, state, hp, t)
            lr, mu = np.float32(0.7), np.float32(0.9)
            for n in SHAPES:
                d = delta[n].numpy()
                if rule == "nesterov":
                    m[n] = m[n] * mu + d
                    d = d + m[n] * mu
                want[n] = want[n] - d * lr
                assert np.array_equal(params[n].numpy(), want[n])
        assert state.steps == 3


def test_signed_step_moves_every_parameter_by_alpha():
    hp = _hp("signed")
    params = {n: torch.zeros(s) for n, s in SHAPES.items()}
    delta = {n: torch.ones(s) for n, s in SHAPES.items()}
    unit = apply_outer(params, delta, OuterState(), hp, 100)
    assert unit == pytest.approx(hp.learning_rate, rel=1e-6)
    assert outer_lr(hp, 100) == hp.learning_rate and outer_lr(_hp("sgd", lr=0.5), 0) == 0.5


def test_outer_state_round_trip_and_strictness():
    hp = _hp("nesterov")
    state = OuterState.fresh(SHAPES, hp)
    state.momentum["a"].normal_()
    state.steps = 4
    again = OuterState.from_tensors(state.tensors(), SHAPES, hp)
    assert again is not None and again.digest() == state.digest() and again.steps == 4
    bad = state.tensors()
    bad["outer.momentum.a"] = torch.full(SHAPES["a"], math.nan)
    assert OuterState.from_tensors(bad, SHAPES, hp) is None
    bad = state.tensors()
    bad["outer.momentum.b"] = torch.zeros(71)
    assert OuterState.from_tensors(bad, SHAPES, hp) is None
    bad = state.tensors()
    del bad["outer.momentum.c"]
    assert OuterState.from_tensors(bad, SHAPES, hp) is None
    assert OuterState.from_tensors(state.tensors(), SHAPES, _hp("sgd")) is None  # sgd keeps no momentum
    assert OuterState.from_tensors(OuterState(steps=2).tensors(), SHAPES, _hp("sgd")).steps == 2


_REPLAY = """
import sys, torch
sys.path.insert(0, {root!r})
from dso.codec.demo import DeMoCodec, TensorUpdate
from dso.config.schema import HParams
from dso.nn.model import state_hash
from dso.training.outer import OuterState, aggregate, apply_outer
shapes = {shapes!r}
codec = DeMoCodec(shapes, chunk=64, topk=16, value_bits=4)
hp = HParams(); hp.outer.rule = "nesterov"
g = torch.Generator().manual_seed(3)
params = {{n: torch.randn(s, generator=g) for n, s in shapes.items()}}
state = OuterState.fresh(shapes, hp)
threads = torch.get_num_threads()
for t in range(3):
    # the inputs: each miner compresses on its own (a threaded float DCT may round differently from run to run:
    # 4 of 12 runs with 2 threads selected other coefficients), so they are made with one thread; the outer
    # step, which every node must agree on, runs with the process's threads
    torch.set_num_threads(1)
    ups = [codec.compress({{n: torch.randn(s, generator=g) for n, s in shapes.items()}}, 0) for _ in range(4)]
    torch.set_num_threads(threads)
    apply_outer(params, aggregate(codec, ups, hp, [1, 2, 3, 4]).delta, state, hp, t)
print(state_hash(params.items()), state.digest())
"""


def test_outer_step_is_bit_identical_in_a_fresh_process():
    code = _REPLAY.format(root=str(ROOT), shapes=SHAPES)
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"OMP_NUM_THREADS": str(threads), "PATH": "/usr/bin:/bin"}).stdout
            for threads in (1, 2)]
    here = {}
    exec(compile(code.replace("print(", "here['out'] = ("), "replay", "exec"), {"here": here})
    assert runs[0] == runs[1]
    assert runs[0].split() == list(here["out"])


# ------------------------------------------------------------ evaluation
def test_evaluation_step_signed_is_c_alpha_sign():
    codec = _codec()
    u = _updates(codec, 1)[0]
    hp = _hp("signed")
    step = peer_evaluation_step(codec, u, hp, 10, {})
    for n, d in codec.decompress(u).items():
        assert torch.equal(step[n], torch.sign(d) * (hp.eval_scale * hp.learning_rate))


def test_evaluation_step_of_the_optimiser_rules_uses_the_reference_norm():
    codec = _codec()
    plain = _updates(codec, 1, seed=2)[0]
    scaled = _scaled(plain, 1000.0)
    ref = {"a": 2.0, "b": 0.5, "c": 1.0}
    for rule, factor in (("sgd", 1.0), ("nesterov", 1.9)):
        hp = _hp(rule, lr=0.8, momentum=0.9)
        a, b = peer_evaluation_step(codec, plain, hp, 0, ref), peer_evaluation_step(codec, scaled, hp, 0, ref)
        for n in ("a", "b"):  # orthonormal DCT, no padding: the decoded norm is the codec norm
            assert float(a[n].norm()) == pytest.approx(hp.eval_scale * 0.8 * factor * ref[n], rel=1e-4)
        for n in SHAPES:  # scaling the update changes nothing
            assert torch.allclose(a[n], b[n], rtol=1e-5, atol=1e-9)
    zero = evaluation_step(_hp("sgd"), 0, {"a": torch.zeros(3)}, {"a": 0.0}, {"a": 1.0})
    assert torch.equal(zero["a"], torch.zeros(3))


# ------------------------------------------------------------ rule objects
def test_the_run_picks_its_outer_rule_by_name_and_refuses_an_unknown_one():
    from dso.training.outer_rules import OUTER_RULES, NesterovRule, SgdRule, SignedRule, outer_rule

    picked = {name: type(outer_rule(_hp(name))) for name in OUTER_RULES}
    assert picked == {"signed": SignedRule, "sgd": SgdRule, "nesterov": NesterovRule}
    assert [name for name, cls in OUTER_RULES.items() if cls.signs] == ["signed"]
    assert [name for name, cls in OUTER_RULES.items() if cls.keeps_momentum] == ["nesterov"]
    assert OuterState.fresh(SHAPES, outer_rule(_hp("nesterov"))).momentum.keys() == SHAPES.keys()
    assert OuterState.fresh(SHAPES, _hp("signed")).momentum == {}
    with pytest.raises(ValueError, match="outer rule must be one of signed, sgd, nesterov, got 'adam'"):
        outer_rule(_hp("adam"))
