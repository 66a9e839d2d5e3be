"""θ_{t+1} and the outer state are bit-identical on the validator, a follower and a node catching up from a
checkpoint, for every outer rule (signed, sgd, and the stateful nesterov)."""
import copy
import typing

import pytest
import torch

from dso.codec.codecs import make_codec
from dso.config.schema import OuterConfig
from dso.nn.model import build_model, model_hash, parameter_shapes
from dso.protocol.payload import Payload, PayloadMeta
from dso.training.inner import InnerLoop
from dso.training.outer import OuterState
from dso.training.outer_rules import OUTER_RULES, outer_rule
from neurons.catchup import apply_bundle
from neurons.engine import aggregate_window
from storage.aggregate import Bundle
from storage.checkpoint_file import decode_checkpoint, encode_checkpoint

WINDOWS = 4
PEERS = [3, 1, 2]


def _payloads(hp, model, codec, window: int) -> dict[int, Payload]:
    """Each peer's compressed pseudo-gradient of two inner steps on random tokens, from θ_t."""
    out = {}
    for uid in PEERS:
        loop = InnerLoop(copy.deepcopy(model), hp)
        g = torch.Generator().manual_seed(100 * window + uid)
        loop.train(window, torch.randint(0, hp.model.vocab_size, (2 * hp.batch_size, hp.model.seq_len + 1),
                                         generator=g))
        update = codec.compress(loop.pseudo_gradient(), window, uid)
        meta = PayloadMeta(uid, window, hp.protocol_version, hp.digest())
        out[uid] = Payload(meta, update, torch.zeros(hp.sync_samples), 0, 0.0)
    return out


def test_every_outer_rule_is_covered():
    assert set(OUTER_RULES) == set(typing.get_args(typing.get_type_hints(OuterConfig)["rule"])) \
        == {"signed", "sgd", "nesterov"}


@pytest.mark.parametrize("rule", OUTER_RULES)
def test_validator_follower_and_catch_up_agree_bit_for_bit(tiny_hparams, rule):
    hp = tiny_hparams
    hp.outer.rule, hp.outer.lr = rule, 0.5
    validator = build_model(hp.model, hp.seed)
    shapes = parameter_shapes(validator)
    codec = make_codec(shapes, hp)
    follower, v_outer, f_outer = copy.deepcopy(validator), OuterState.fresh(shapes, hp), OuterState.fresh(shapes, hp)
    bundles, checkpoint = [], None
    for t in range(WINDOWS):
        if t == 2:  # the validator's checkpoint of θ_2 and its outer state, as bytes
            checkpoint, _ = encode_checkpoint(validator.named_parameters(), t, hp.protocol_version, hp.digest(),
                                              outer=v_outer)
        payloads = _payloads(hp, validator, codec, t)
        agg = aggregate_window(validator, codec, hp, t, payloads, PEERS, v_outer)
        bundle = Bundle(t, agg.used, agg.payloads, agg.hash_before, agg.hash_after, agg.outer_before, agg.outer_after)
        bundles.append(bundle)
        assert apply_bundle(follower, codec, hp, bundle, f_outer) is None
        assert model_hash(follower) == agg.hash_after and f_outer.digest() == agg.outer_after
        assert agg.hash_after != agg.hash_before  # the model moved
    if outer_rule(hp).keeps_momentum:
        assert any(float(m.abs().sum()) > 0 for m in v_outer.momentum.values())
    assert v_outer.steps == f_outer.steps == WINDOWS

    # catch-up: the checkpoint of window 2, then the bundles of windows 2 and 3
    ckpt = decode_checkpoint(checkpoint, shapes, hp.protocol_version, hp.digest(), 2, rule=outer_rule(hp))
    late = build_model(hp.model, hp.seed + 1)
    ckpt.load_into(late)
    outer = ckpt.outer
    assert apply_bundle(late, codec, hp, bundles[1], outer) is not None  # not at that window's model
    for bundle in bundles[2:]:
        assert apply_bundle(late, codec, hp, bundle, outer) is None
    assert model_hash(late) == model_hash(validator) and outer.digest() == v_outer.digest()


def test_a_wrong_outer_state_is_refused_not_replayed(tiny_hparams):
    hp = tiny_hparams
    hp.outer.rule = "nesterov"
    model = build_model(hp.model, hp.seed)
    shapes = parameter_shapes(model)
    codec = make_codec(shapes, hp)
    follower, outer = copy.deepcopy(model), OuterState.fresh(shapes, hp)
    agg = aggregate_window(model, codec, hp, 0, _payloads(hp, model, codec, 0), PEERS, OuterState.fresh(shapes, hp))
    bundle = Bundle(0, agg.used, agg.payloads, agg.hash_before, agg.hash_after, agg.outer_before, agg.outer_after)
    outer.steps = 5  # same θ, another outer state: replaying would give another θ_{t+1} later
    bad = apply_bundle(follower, codec, hp, bundle, outer)
    assert bad is not None and "outer" in bad.detail
    assert model_hash(follower) == agg.hash_before  # nothing moved


def test_checkpoint_holds_the_outer_state_strictly(tiny_hparams):
    hp = tiny_hparams
    hp.outer.rule = "nesterov"
    model = build_model(hp.model, hp.seed)
    shapes = parameter_shapes(model)
    outer = OuterState.fresh(shapes, hp)
    outer.steps = 7
    next(iter(outer.momentum.values())).fill_(0.25)
    data, _ = encode_checkpoint(model.named_parameters(), 3, hp.protocol_version, hp.digest(), outer=outer)
    got = decode_checkpoint(data, shapes, hp.protocol_version, hp.digest(), 3, rule=outer_rule(hp))
    assert got.outer.digest() == outer.digest() and got.outer.steps == 7
    # a checkpoint of the sgd rule (no momentum) does not pass for a nesterov run
    plain, _ = encode_checkpoint(model.named_parameters(), 3, hp.protocol_version, hp.digest(), outer=OuterState())
    assert decode_checkpoint(plain, shapes, hp.protocol_version, hp.digest(), 3, rule=outer_rule(hp)).reason.value \
        == "bad_keys"
