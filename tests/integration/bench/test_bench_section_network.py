"""The quick benchmark's sections in quick_bench.ALONE["network"] run to the end, in a file of their own so that a
parallel run gives them a process of their own (tests/quick_bench.py)."""
from __future__ import annotations

import pytest
import quick_bench


@pytest.mark.parametrize("section", quick_bench.ALONE["network"])
def test_the_section_of_the_quick_benchmark_runs(section, tmp_path):
    quick_bench.run_section(section, tmp_path)
