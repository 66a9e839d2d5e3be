"""Sync sample positions (shared by miners and validators) and the sync vector check."""
from __future__ import annotations

import math

import torch

from dso.protocol.rejections import Reason
from scoring.sync import check_sync_vector, sample_parameters, sync_positions

SHAPES = {"embed.weight": (256, 32), "blocks.0.attn_norm.weight": (32,), "blocks.0.attn.wq.weight": (32, 32),
          "tiny": (3,)}


def test_positions_are_deterministic_in_range_and_cover_every_tensor():
    a = sync_positions(b"\x01" * 32, SHAPES, 20)
    assert a == sync_positions(b"\x01" * 32, SHAPES, 20)
    assert len(a) == 20
    names = [name for name, _ in a]
    assert names[:4] == list(SHAPES) and set(names) == set(SHAPES)        # round robin in model order
    for name, index in a:
        assert 0 <= index < math.prod(SHAPES[name])
    big = [i for n, i in a if n == "embed.weight"]
    assert len(big) == len(set(big))                                      # distinct within a tensor


def test_positions_change_with_the_window_randomness():
    a = sync_positions(b"\x01" * 32, SHAPES, 16)
    b = sync_positions(b"\x02" * 32, SHAPES, 16)
    assert [n for n, _ in a] == [n for n, _ in b]
    assert [i for _, i in a] != [i for _, i in b]


def test_tiny_tensor_repeats_instead_of_looping_forever():
    positions = sync_positions(b"r", {"tiny": (2,)}, 5)
    assert len(positions) == 5 and {i for _, i in positions} == {0, 1}
    assert sync_positions(b"r", SHAPES, 0) == [] and sync_positions(b"r", {}, 4) == []


def test_sample_parameters_reads_flat_indices():
    named = {"a": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.tensor([5.0, -1.0])}
    out = sample_parameters(named, [("a", 0), ("a", 7), ("b", 1)])
    assert out.dtype == torch.float32
    assert out.tolist() == [0.0, 7.0, -1.0]
    assert sample_parameters(named, []).shape == (0,)


def test_check_sync_vector_reasons():
    assert check_sync_vector(torch.zeros(4), 4) is None
    assert check_sync_vector([0.0] * 4, 4).reason is Reason.MALFORMED
    assert check_sync_vector(torch.zeros(4, dtype=torch.float64), 4).reason is Reason.BAD_DTYPE
    assert check_sync_vector(torch.zeros(5), 4).reason is Reason.BAD_SHAPE
    assert check_sync_vector(torch.zeros(2, 2), 4).reason is Reason.BAD_SHAPE
    bad = torch.zeros(4)
    bad[2] = math.inf
    assert check_sync_vector(bad, 4).reason is Reason.NON_FINITE
    assert check_sync_vector(torch.zeros(4), 4) is None


# ------------------------------------------------------------ coverage at any model size
def _shapes(cfg) -> dict:
    """The parameter shapes of ``cfg`` without building it: a copy with small, distinct widths, mapped back."""
    import dataclasses

    from dso.nn.model import Decoder, parameter_shapes
    small = dataclasses.replace(cfg, vocab_size=5, d_model=4, n_heads=2, ffn_hidden=6, seq_len=2)
    back = {5: cfg.vocab_size, 4: cfg.d_model, 6: cfg.ffn_hidden}
    return {name: tuple(back[d] for d in shape) for name, shape in parameter_shapes(Decoder(small)).items()}


BILLION = dict(vocab_size=32000, d_model=2048, n_layers=24, n_heads=16, ffn_hidden=5632, seq_len=2048)


def test_every_tensor_of_a_billion_parameter_model_is_checked_every_window():
    from dso.config.schema import HParams, ModelConfig
    from dso.nn.model import sync_sample_count, tensor_count

    hp = HParams(model=ModelConfig(**BILLION))
    shapes = _shapes(hp.model)
    assert 1.0e9 < sum(math.prod(s) for s in shapes.values()) < 1.5e9
    assert tensor_count(hp.model) == len(shapes) == 2 + 24 * 9
    # the old fixed total of 64 samples leaves most tensors unchecked in a window
    assert len({name for name, _ in sync_positions(b"\x07" * 32, shapes, hp.sync_samples)}) == 64
    n = sync_sample_count(hp)
    assert n == len(shapes)
    for window in range(3):
        positions = sync_positions(bytes([window]) * 32, shapes, n)
        assert {name for name, _ in positions} == set(shapes)
    hp.sync_samples_per_tensor = 3
    per_tensor = [name for name, _ in sync_positions(b"\x01" * 32, shapes, sync_sample_count(hp))]
    assert all(per_tensor.count(name) == 3 for name in shapes)


def test_the_floor_holds_for_small_models():
    from dso.config.schema import HParams, ModelConfig
    from dso.nn.model import Decoder, sync_sample_count, tensor_count

    hp = HParams()
    assert tensor_count(hp.model) == 38 and sync_sample_count(hp) == 64   # the default model: unchanged
    deep = HParams(model=ModelConfig(d_model=8, n_layers=12, n_heads=2, ffn_hidden=16, seq_len=8))
    assert tensor_count(deep.model) == len(list(Decoder(deep.model).parameters())) == 110
    assert sync_sample_count(deep) == 110
    assert _shapes(deep.model) == {n: tuple(p.shape) for n, p in Decoder(deep.model).named_parameters()}


def test_wire_checks_take_the_same_length():
    """A payload with one sample per tensor passes the strict decoder; the old 64-sample vector is refused."""
    from dso.codec.demo import DeMoCodec
    from dso.config.schema import HParams, ModelConfig
    from dso.nn.model import build_model, parameter_shapes, sync_sample_count
    from dso.protocol.payload import PayloadMeta
    from storage.wire import Expect, decode_payload, encode_payload, payload_size_cap

    hp = HParams(model=ModelConfig(d_model=8, n_layers=12, n_heads=2, ffn_hidden=16, seq_len=8))
    hp.chunk, hp.topk = 8, 4
    model = build_model(hp.model, hp.seed)
    shapes = parameter_shapes(model)
    codec = DeMoCodec.from_hparams(shapes, hp)
    update = codec.compress({k: torch.randn(s) for k, s in shapes.items()}, 0)
    n = sync_sample_count(hp)
    expect = Expect.from_hparams(hp, 0)
    assert expect.sync_samples == n == 110
    sync = sample_parameters(dict(model.named_parameters()), sync_positions(b"\x02" * 32, shapes, n))
    good = encode_payload(codec, update, sync, PayloadMeta(0, 0, hp.protocol_version, hp.digest()))
    assert len(good) <= payload_size_cap(codec, expect.sync_samples)
    assert torch.equal(decode_payload(good, codec, expect).sync_values, sync)
    short = encode_payload(codec, update, torch.zeros(hp.sync_samples), PayloadMeta(0, 0, hp.protocol_version,
                                                                                   hp.digest()))
    assert decode_payload(short, codec, expect).reason is Reason.BAD_SHAPE
