"""Every section of ``scripts/bench.py --quick`` runs to the end: one broken section (an API it calls changed, a
key it reads is gone) fails here instead of in the next full benchmark run.  One test per section, so a parallel
run (``pytest -n``) spreads them."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from repo import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

from benchmarks import SECTIONS  # noqa: E402


@pytest.mark.parametrize("section", list(SECTIONS))
def test_the_section_of_the_quick_benchmark_runs(section, tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "scripts/bench.py", "--quick", "--only", section, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.exists(), done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert section in result and "error" not in result[section], (result.get(section), done.stderr[-4000:])
    assert done.returncode == 0, done.stderr[-4000:]
    assert result["targets"], "no target was checked"
