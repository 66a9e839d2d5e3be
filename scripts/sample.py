#!/usr/bin/env python
"""Text from a checkpoint: ``python scripts/sample.py CHECKPOINT --prompt TEXT`` (see sim/sample.py)."""
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

from sim.sample import main

if __name__ == "__main__":
    sys.exit(main())
