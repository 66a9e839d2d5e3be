"""Fixtures for the storage unit tests: the tiny model/codec of tests/storage_fixtures.py."""
from storage_fixtures import codec, hp, make_update, model, shapes  # noqa: F401 — fixtures, used by name
