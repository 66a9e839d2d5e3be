#!/usr/bin/env python
"""Benchmarks: codec, payload size against its bound, validator cost, gather scaling, convergence.

    python scripts/bench.py [--quick] [--out FILE] [--only SECTION ...]

Writes a JSON file (default ``bench.json``) and prints a Markdown table.  Numbers
are medians over repeats; ratios are measured within the same run.  Sections
live in ``scripts/benchmarks/`` — one module each.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from benchmarks import SECTIONS, markdown  # noqa: E402


def machine() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
            "date": time.strftime("%Y-%m-%d")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small repeats and sizes (about a minute)")
    parser.add_argument("--out", default="bench.json", help="JSON output file")
    parser.add_argument("--only", nargs="*", choices=list(SECTIONS), help="run only these sections")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = {"quick": args.quick, "machine": machine()}
    for name, run in SECTIONS.items():
        if args.only and name not in args.only:
            continue
        print(f"bench: {name} …", file=sys.stderr, flush=True)
        started = time.perf_counter()
        result[name] = run(quick=args.quick)
        print(f"bench: {name} done in {time.perf_counter() - started:.1f}s", file=sys.stderr, flush=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(markdown(result))
    print(f"\nwrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
