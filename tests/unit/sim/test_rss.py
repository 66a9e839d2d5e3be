"""sim/rss.py: each phase's peak resident memory is what that phase held."""
import sys

import pytest
import torch

from sim.rss import PhasePeaks, rss_mb

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")


def test_a_phase_that_holds_a_tensor_peaks_higher_by_its_size():
    with PhasePeaks("before", interval_s=0.001) as peaks:
        peaks.phase("holding")
        held = torch.ones(64 * 2 ** 20 // 4)  # 64 MB, every page written
        peaks.phase("after")
        del held
    assert set(peaks.peaks_mb) == {"before", "holding", "after"}
    assert peaks.peaks_mb["holding"] >= peaks.peaks_mb["before"] + 60
    assert rss_mb() > 0
