"""The scoring tests' fixtures (tests/unit/scoring/conftest.py): the same tiny model and data."""
from unit.scoring.conftest import dataset, hp  # noqa: F401 — fixtures, used by name
