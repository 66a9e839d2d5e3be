"""Every section of ``scripts/bench.py --quick`` runs to the end: one broken section (an API it calls changed, a
key it reads is gone) fails here instead of in the next full benchmark run."""
from __future__ import annotations

import json
import subprocess
import sys

from repo import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

from benchmarks import SECTIONS  # noqa: E402


def test_every_section_of_the_quick_benchmark_runs(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "scripts/bench.py", "--quick", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=1500)
    assert out.exists(), done.stderr[-4000:]
    result = json.loads(out.read_text())
    failed = {name: result[name]["error"] for name in SECTIONS if "error" in result.get(name, {})}
    assert not failed, (failed, done.stderr[-4000:])
    assert set(SECTIONS) <= set(result) and done.returncode == 0, done.stderr[-4000:]
    assert result["targets"], "no target was checked"
