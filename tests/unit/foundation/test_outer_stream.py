"""The outer step applies Δ tensor by tensor (dso/training/outer.py ``StreamedDelta``): each tensor of the aggregate is
decoded when the step reaches it and freed before the next, with the bits the whole-Δ application gave, for every
outer rule and aggregation rule."""
import gc
import weakref

import pytest
import torch

from dso.codec.demo import DeMoCodec, TensorUpdate
from dso.codec.sketch import SketchCodec
from dso.config.schema import HParams
from dso.nn.model import state_hash
from dso.training.outer import OuterState, StreamedDelta, aggregate, apply_outer
from dso.training.outer_rules import OUTER_RULES

SHAPES = {"a": (128, 192), "b": (70,), "c": (96, 130)}
PEERS, WINDOWS = 4, 3

# state_hash of θ and the outer state's digest after WINDOWS steps of _run on the exact path (DeMo codec, plain mean),
# computed by the whole-Δ application that preceded streaming (every tensor of Δ decoded before the first was
# applied): the streamed one must give these bits
WHOLE_DELTA_RESULT = {
    "signed": ("bc0a0135cfb9afacfe55ed2771c7233191a21b1cc9cf4321ea2c6963fc74f1bb",
               "91de221ee946b71dcb7bc4092093fc2733081932c3a23167316ca80d2340bf0b"),
    "sgd": ("9227029a9c4d120ef03376d90dfd42bd66581ebb7ad7bd909b41f0bd70682d70",
            "91de221ee946b71dcb7bc4092093fc2733081932c3a23167316ca80d2340bf0b"),
    "nesterov": ("786920efdc9bd8492534b93f4fb9a3eaee056fa0db5c645084b276b56c0a4b6e",
                 "c921753709568f95f58fea67cc9fd49acaf5421640fe7df2e4e17b85464068bd"),
}


def _hp(rule: str, aggregation: str = "mean", coherence: float = -1.0) -> HParams:
    hp = HParams()
    hp.outer.rule, hp.outer.lr, hp.outer.momentum = rule, 0.7, 0.9
    hp.weight_decay = 0.1  # the signed rule's decay runs too
    hp.aggregation, hp.coherence_threshold = aggregation, coherence
    return hp


def _codec() -> DeMoCodec:
    return DeMoCodec(SHAPES, chunk=64, topk=16, value_bits=4)


def _updates(codec: DeMoCodec, seed: int) -> list[dict[str, TensorUpdate]]:
    """PEERS compressed updates drawn as integers (no float transform: the same bits on any machine)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(PEERS):
        update = {}
        for name, plan in codec.plans.items():
            keys = torch.randint(0, 2 ** 30, (plan.n_chunks, plan.chunk_size), generator=g)
            idx = keys.argsort(dim=1, stable=True)[:, :16].sort(dim=1).values
            codes = torch.randint(0, 16, (plan.n_chunks, 16), generator=g).to(torch.uint8)
            scale = torch.randint(1, 1000, (8,), generator=g).sort().values.float() / 256
            update[name] = TensorUpdate(idx, codes, scale)
        out.append(update)
    return out


def _theta(seed: int = 7) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randint(-4096, 4096, s, generator=g).float() / 4096 for n, s in SHAPES.items()}


def _run(hp: HParams, codec, updates_of, whole: bool) -> tuple[dict[str, torch.Tensor], OuterState]:
    """WINDOWS outer steps; ``whole``: every tensor of Δ decoded first (a dict), else streamed."""
    params, state = _theta(), OuterState.fresh(SHAPES, hp)
    for t in range(WINDOWS):
        delta = aggregate(codec, updates_of(codec, t), hp, list(range(PEERS))).delta
        apply_outer(params, dict(delta) if whole else delta, state, hp, t)
    return params, state


@pytest.mark.parametrize("rule", sorted(OUTER_RULES))
def test_the_streamed_step_gives_the_whole_delta_bits(rule):
    params, state = _run(_hp(rule), _codec(), _updates, whole=False)
    assert (state_hash(params.items()), state.digest()) == WHOLE_DELTA_RESULT[rule]
    assert state.steps == WINDOWS


def _sketch_updates(codec: SketchCodec, t: int) -> list:
    g = torch.Generator().manual_seed(t)
    return [codec.compress({n: torch.randn(s, generator=g) for n, s in SHAPES.items()}, t) for _ in range(PEERS)]


@pytest.mark.parametrize("rule", sorted(OUTER_RULES))
@pytest.mark.parametrize("aggregation,coherence", [("mean", 0.0), ("median", -1.0), ("trimmed_mean", -1.0),
                                                   ("krum", -1.0), ("geomedian", -1.0)])
def test_robust_aggregations_step_alike_streamed_or_whole(rule, aggregation, coherence):
    hp = _hp(rule, aggregation, coherence)
    streamed, whole = (_run(hp, _codec(), _updates, whole=w) for w in (False, True))
    assert state_hash(streamed[0].items()) == state_hash(whole[0].items())
    assert streamed[1].digest() == whole[1].digest()


@pytest.mark.parametrize("rule", sorted(OUTER_RULES))
def test_the_sketch_codec_steps_alike_streamed_or_whole(rule):
    hp = _hp(rule)
    codec = SketchCodec(SHAPES, dim=512, seed=1)
    streamed, whole = (_run(hp, codec, _sketch_updates, whole=w) for w in (False, True))
    assert state_hash(streamed[0].items()) == state_hash(whole[0].items())
    assert streamed[1].digest() == whole[1].digest()


@pytest.mark.parametrize("rule", sorted(OUTER_RULES))
def test_at_most_one_decoded_tensor_is_alive_during_the_step(rule):
    hp, codec = _hp(rule), _codec()
    delta = aggregate(codec, _updates(codec, 0), hp, list(range(PEERS))).delta
    alive: list[weakref.ref] = []
    decoded: list[str] = []

    def watched(name: str) -> torch.Tensor:
        gc.collect()
        assert all(ref() is None for ref in alive), f"a tensor of Δ is still alive when {name} is decoded"
        tensor = delta[name]
        alive.append(weakref.ref(tensor))
        decoded.append(name)
        return tensor

    params = _theta()
    apply_outer(params, StreamedDelta(list(SHAPES), watched), OuterState.fresh(SHAPES, hp), hp, 0)
    assert decoded == list(SHAPES)  # each tensor decoded once, in θ's order
    want = _theta()
    apply_outer(want, dict(delta), OuterState.fresh(SHAPES, hp), hp, 0)
    assert all(torch.equal(params[n], want[n]) for n in SHAPES)


def test_a_kept_delta_is_decoded_once_and_read_again():
    codec, hp = _codec(), _hp("sgd")
    calls: list[str] = []
    source = aggregate(codec, _updates(codec, 0), hp, list(range(PEERS))).delta

    def counted(name: str) -> torch.Tensor:
        calls.append(name)
        return source[name]

    delta = StreamedDelta(list(SHAPES), counted)
    kept = delta.keep()
    apply_outer(_theta(), delta, OuterState.fresh(SHAPES, hp), hp, 0)
    assert calls == list(SHAPES) and list(kept) == list(SHAPES)
    assert all(torch.equal(kept[n], source[n]) for n in SHAPES) and calls == list(SHAPES)
    with pytest.raises(KeyError):
        delta["nope"]
