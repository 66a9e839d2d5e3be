"""The extension benchmarks run and report sane, honest numbers (no timing assertions)."""
from __future__ import annotations

import importlib.util
import math

import torch

from repo import ROOT

torch.set_num_threads(1)
SCRIPTS = ROOT / "scripts"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_sketch_vs_demo_quick():
    bench = load("sketch")
    res = bench.bench_sketch_vs_demo(quick=True)
    from dso.codec.demo import DeMoCodec
    from dso.codec.sketch import SketchCodec
    from dso.config.schema import HParams
    from dso.nn.model import build_model, parameter_shapes
    hp = HParams()
    shapes = parameter_shapes(build_model(hp.model, hp.seed))
    assert res["demo"]["payload_bytes"] == DeMoCodec.from_hparams(shapes, hp).payload_bytes()
    assert res["sketch"]["payload_bytes"] == SketchCodec.from_hparams(shapes, hp).payload_bytes()
    assert res["model_parameters"] == sum(math.prod(s) for s in shapes.values())
    for name in ("demo", "sketch", "sketch_demo_bytes"):
        r = res[name]
        assert 0 < r["cosine"] < 1 and 0 < r["cosine_of_sign"] < 1, name
        ef_key = next(k for k in r if k.startswith("cosine_ef_"))
        assert r[ef_key] > r["cosine"], name  # error feedback delivers more over several windows
    # a smaller sketch keeps less of the update: the codec's cosine follows sqrt(d / P) (which of the two is
    # smaller depends on DeMo's payload: 2-bit values with level tables made it larger than the default sketch)
    small, large = sorted((res["sketch"], res["sketch_demo_bytes"]), key=lambda r: r["payload_bytes"])
    assert small["payload_bytes"] < large["payload_bytes"] and small["cosine"] < large["cosine"]
    assert "| cosine |" in bench.markdown(res)


def test_bench_robust_quick():
    bench = load("robust")
    res = bench.bench_robust(quick=True)
    table = res["trim_beta_0.2"]
    assert min(table[rule][a] for rule in ("krum", "median", "trimmed_mean", "geomedian") for a in table[rule]) > 0.9
    assert table["mean"]["scaling"] < 0.5
    assert "| geomedian |" in bench.markdown(res)
