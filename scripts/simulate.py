#!/usr/bin/env python
"""In-process simulations: see sim/simulate.py (``--help`` lists the commands)."""
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

from sim.simulate import main

if __name__ == "__main__":
    sys.exit(main())
