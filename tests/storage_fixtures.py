"""The storage tests' tiny model and codec (module-scoped fixtures), shared by the unit and integration tiers'
storage conftests, which import them by name."""
from __future__ import annotations

import pytest
import torch

from dso.codec.demo import DeMoCodec
from dso.config.schema import HParams, ModelConfig
from dso.nn.model import build_model, parameter_shapes

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def hp() -> HParams:
    # d_model 40 gives 10x10 DCT chunks (universe 100, not a multiple of 2**L), so an
    # Elias-Fano stream can encode an out-of-range index — needed to test that rejection.
    hp = HParams(model=ModelConfig(vocab_size=256, d_model=40, n_layers=1, n_heads=2, ffn_hidden=64, seq_len=16))
    hp.chunk, hp.topk, hp.sync_samples = 16, 8, 16
    hp.attn_topk = 0  # k 8 in the attention matrices too: the crafted out-of-range index needs L = 3 (st_craft.py)
    return hp


@pytest.fixture(scope="module")
def model(hp):
    return build_model(hp.model, hp.seed)


@pytest.fixture(scope="module")
def shapes(model) -> dict:
    return parameter_shapes(model)


@pytest.fixture(scope="module")
def codec(hp, shapes) -> DeMoCodec:
    return DeMoCodec.from_hparams(shapes, hp)


@pytest.fixture(scope="module")
def make_update(codec, shapes):
    def make(seed: int):
        gen = torch.Generator().manual_seed(seed)
        return codec.compress({n: torch.randn(s, generator=gen) for n, s in shapes.items()}, 0)
    return make
