"""docs/deployment.md shows operators the SeaweedFS command the project's own engine runs."""
from __future__ import annotations

import re

from repo import ROOT
from storage.seaweedfs import SERVER_ENV, SERVER_FLAGS, documented_command


def test_the_documented_command_is_the_one_the_engine_runs():
    text = (ROOT / "docs" / "deployment.md").read_text()
    joined = re.sub(r"\s*\\\n\s*", " ", text)          # shell line continuations
    assert documented_command() in joined
    assert "-master.volumeSizeLimitMB=64" in SERVER_FLAGS and SERVER_ENV == {"WEED_MASTER_VOLUME_GROWTH_COPY_1": "1"}
