"""The quick benchmark (``scripts/bench.py --quick --only SECTION ...``) run to the end in a fresh process, with what
each section's figures must show beyond running (no timing).  The bench tier spreads the sections over a few test
files (tests/integration/bench/test_bench_section*.py); each file runs its sections in one process (one interpreter
and one worker server for all of them), and a parallel run (``pytest -n --dist loadfile``, one file per process)
runs the files side by side; a section no file names runs in test_bench_sections.py."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import torch

from repo import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

from benchmarks import MODULES, SECTIONS  # noqa: E402

# the slow sections, in files of their own (about four minutes of a loaded 2-core machine each, measured)
ALONE = {"data": ("data",), "network": ("gather", "scale"), "simulated": ("convergence", "incentives")}
REST = [name for name in SECTIONS if not any(name in names for names in ALONE.values())]


class QuickRun(NamedTuple):
    result: dict  # what bench.py wrote
    stderr: str   # the end of its log, to show with a failure


def run_sections(sections: Sequence[str], out_dir: Path) -> QuickRun:
    """One ``bench.py --quick --only SECTIONS`` run; fails with its stderr when it wrote nothing."""
    out = out_dir / "bench.json"
    done = subprocess.run([sys.executable, "scripts/bench.py", "--quick", "--only", *sections, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert out.exists(), done.stderr[-4000:]
    return QuickRun(json.loads(out.read_text()), done.stderr[-4000:])


def check_section(section: str, run: QuickRun) -> dict:
    """The section ran without an error, the targets were checked, and its figures pass its own checks."""
    assert section in run.result and "error" not in run.result[section], (run.result.get(section), run.stderr)
    assert run.result["targets"], "no target was checked"
    CHECKS.get(section, lambda body: None)(run.result[section])
    return dict(run.result[section])


def section_tests(sections: Sequence[str]) -> tuple[Callable, Callable]:
    """A test file's module fixture (one quick run of ``sections``) and its test, one per section."""
    import pytest

    @pytest.fixture(scope="module")
    def quick_run(tmp_path_factory):  # type: ignore[no-untyped-def]
        return run_sections(sections, tmp_path_factory.mktemp("bench"))

    @pytest.mark.parametrize("section", sections)
    def test_the_section_of_the_quick_benchmark_runs(section, quick_run):  # type: ignore[no-untyped-def]
        check_section(section, quick_run)

    return quick_run, test_the_section_of_the_quick_benchmark_runs


def sketch_is_sane(res: dict) -> None:
    """Bytes as the codecs say, cosines in (0, 1), error feedback helping, a smaller sketch keeping less."""
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
    assert "| cosine |" in MODULES["sketch"].markdown(res)


def robust_is_sane(res: dict) -> None:
    """Every robust rule keeps the honest direction (cosine > 0.9) under every attack; the plain mean does not."""
    table = res["trim_beta_0.2"]
    assert min(table[rule][a] for rule in ("krum", "median", "trimmed_mean", "geomedian") for a in table[rule]) > 0.9
    assert table["mean"]["scaling"] < 0.5
    assert "| geomedian |" in MODULES["robust"].markdown(res)


def device_is_sane(got: dict) -> None:
    """The CPU is measured; a missing GPU is named, not measured."""
    assert got["cpu_tokens_per_second"] > 0 and got["steps"] == 3
    if not torch.cuda.is_available():
        assert got["cuda_tokens_per_second"] is None and "not measured" in got["cuda_device"]


CHECKS: dict[str, Callable[[dict], None]] = {"sketch": sketch_is_sane, "robust": robust_is_sane,
                                             "device": device_is_sane}
