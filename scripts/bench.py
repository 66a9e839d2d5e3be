#!/usr/bin/env python
"""Benchmarks: codec, payload size against its bound, validator cost, gather scaling, convergence.

    python scripts/bench.py [--quick] [--out FILE] [--only SECTION ...]

Writes a JSON file (default ``bench.json``) and prints Markdown tables, then the issue's targets
(met / missed).  Numbers are medians over repeats; ratios are measured within the same run.
Sections live in ``scripts/benchmarks/`` — one module each; see docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from benchmarks import SECTIONS, markdown  # noqa: E402
from benchmarks.targets import check_targets  # noqa: E402


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 ** 2, 1)
    except (OSError, ValueError):
        pass
    return None


def machine() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "cpus": os.cpu_count(), "processor": _cpu_model(), "memory_gb": _memory_gb(),
            "torch_threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d %H:%M"),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: the smallest sizes that cover each section (all: ~4 CPU minutes)")
    parser.add_argument("--out", default="bench.json", help="JSON output file")
    parser.add_argument("--only", nargs="*", choices=list(SECTIONS), help="run only these sections")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result: dict = {"quick": args.quick, "machine": machine(), "section_seconds": {}}
    started_all = time.perf_counter()
    failed = []
    for name, run in SECTIONS.items():
        if args.only and name not in args.only:
            continue
        print(f"bench: {name} …", file=sys.stderr, flush=True)
        started = time.perf_counter()
        try:
            result[name] = run(quick=args.quick)
        except Exception as exc:  # noqa: BLE001 — one broken section must not lose the others' numbers
            traceback.print_exc()
            result[name] = {"error": f"{type(exc).__name__}: {exc}"}
            failed.append(name)
        seconds = time.perf_counter() - started
        result["section_seconds"][name] = round(seconds, 1)
        print(f"bench: {name} done in {seconds:.1f}s", file=sys.stderr, flush=True)
    result["total_seconds"] = round(time.perf_counter() - started_all, 1)
    result["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result["targets"] = check_targets(result)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    print(f"\nwrote {args.out} in {result['total_seconds']:.0f} s", file=sys.stderr)
    if failed:
        print(f"bench: sections failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
