"""Fixtures for storage tests against S3: the tiny model/codec of tests/storage_fixtures.py and an S3 engine per
test module, every module run on each engine (moto started per module; SeaweedFS shared by the session)."""
from __future__ import annotations

import pytest

from s3_engines import start_s3_engine
from storage.engines import ENGINES
from storage_fixtures import codec, hp, make_update, model, shapes  # noqa: F401 — fixtures, used by name


@pytest.fixture(scope="module", params=ENGINES)
def s3(request):
    engine, stop = start_s3_engine(request, request.param)
    yield engine
    if stop is not None:
        stop()
