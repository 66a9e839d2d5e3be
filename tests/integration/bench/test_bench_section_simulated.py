"""The quick benchmark's sections in quick_bench.ALONE["simulated"] run to the end, in a file of their own so that a
parallel run gives them a process of their own (tests/quick_bench.py)."""
from __future__ import annotations

import quick_bench

quick_run, test_the_section_of_the_quick_benchmark_runs = quick_bench.section_tests(quick_bench.ALONE["simulated"])
