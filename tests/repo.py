"""Where the repository is, for tests that run its scripts or read its files (one place, whatever the tier depth)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
