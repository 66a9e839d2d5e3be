"""The near-copy adversaries as real processes on a short local network (embedded S3, LocalChain):
a noise-added copy, a ×0.9 copy, a mix of two peers and a replay of the previous aggregate each get ≤ 1 % of
the weight the validator posts, and the honest miners keep ≥ 95 % of it."""
from __future__ import annotations

import pytest
from short_net import run_short_network

WINDOWS = 12
ADVERSARIES = [("noisycopy", 1), ("scaledcopy", 1), ("mixer", 1), ("replayer", 1)]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, stdlib_corpus, network_hparams):
    report, lines, _ = run_short_network(tmp_path_factory.mktemp("near_copies"), stdlib_corpus, network_hparams(),
                                         ADVERSARIES, WINDOWS)
    return report, lines


def test_near_copies_get_no_weight(finished):
    report, _ = finished
    summary = report["summary"]
    assert summary["good_share"] >= 0.95, report["peers"]
    by_name = {p["name"]: p for p in report["peers"]}
    for name in ("noisycopy0", "scaledcopy0", "mixer0", "replayer0"):
        assert by_name[name]["weight"] <= 0.01, by_name[name]


def test_each_near_copy_is_caught(finished):
    """Each copier did copy and was caught; in the other windows it had nothing to copy in time (missing) or,
    landing together with its source, proof of computation kept the source's update (as for the `copier` of
    tests/e2e/test_adversaries.py, a few windows where it picks wrong on this tiny model are allowed)."""
    report, _ = finished
    by_name = {p["name"]: p for p in report["peers"]}
    for name in ("noisycopy0", "scaledcopy0", "mixer0", "replayer0"):
        got = by_name[name]["rejections"]
        assert got.get("duplicate", 0) >= 2, (name, got)
        assert got.get("duplicate", 0) + got.get("missing", 0) >= WINDOWS - 4, (name, got)


def test_a_copied_author_keeps_its_update(finished):
    """noisycopy and scaledcopy copy the lowest uid (miner0): the validator saw miner0's upload a watch round
    earlier, so the author keeps its update in most windows it uploaded (docs/scoring.md, the watch)."""
    report, lines = finished
    author = next(str(p["uid"]) for p in report["peers"] if p["name"] == "miner0")
    uploaded = [line for line in lines if line["rejections"].get(author) != "missing"]
    lost = [line["window"] for line in uploaded if line["rejections"].get(author) == "duplicate"]
    assert len(uploaded) >= WINDOWS // 2 and len(lost) <= 2, (len(uploaded), lost)


def test_honest_miners_are_never_late(finished):
    """The validator's look at the close never makes an honest miner late (docs/scoring.md, "Upload time")."""
    report, lines = finished
    honest = {str(p["uid"]) for p in report["peers"] if p["behaviour"] == "honest"}
    timing = [(line["window"], u, r) for line in lines for u, r in line["rejections"].items()
              if u in honest and r in ("too_late", "too_early", "changed")]
    assert not timing, timing
    looks = [line["look"] for line in lines if line.get("look")]
    assert looks and all(look["started_after_close"] > 0 for look in looks)
