#!/usr/bin/env python
"""The whole network on this machine: see sim/localnet_main.py (``--help`` lists every flag)."""
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch loads: several torch processes share the cores

from sim.localnet_main import run

if __name__ == "__main__":
    sys.exit(run())
