"""The quick benchmark's sections in quick_bench.ALONE["simulated"] run to the end, in a file of their own so that a
parallel run gives them a process of their own (tests/quick_bench.py)."""
from __future__ import annotations

import pytest
import quick_bench

SECTIONS = quick_bench.ALONE["simulated"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    return quick_bench.run_sections(SECTIONS, tmp_path_factory.mktemp("bench"))


@pytest.mark.parametrize("section", SECTIONS)
def test_the_section_of_the_quick_benchmark_runs(section, quick_run):
    quick_bench.check_section(section, quick_run)
