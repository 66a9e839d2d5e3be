"""Every section of ``scripts/bench.py --quick`` runs to the end: one broken section (an API it calls changed, a
key it reads is gone) fails here instead of in the next full benchmark run.  The slow sections run in files of
their own (test_bench_section_*.py, tests/quick_bench.py says which), so a parallel run spreads them; this file
runs the rest, and any new section."""
from __future__ import annotations

import quick_bench

quick_run, test_the_section_of_the_quick_benchmark_runs = quick_bench.section_tests(quick_bench.REST)


def test_every_section_is_run_by_one_file():
    named = [name for names in quick_bench.ALONE.values() for name in names] + quick_bench.REST
    assert sorted(named) == sorted(quick_bench.SECTIONS)
