"""The copy and timing adversaries as real processes on one short local network (embedded S3, LocalChain).

* Near copies: a noise-added copy, a ×0.9 copy, a mix of two peers and a replay of the previous aggregate.
* Forgers: a backdater and a hider that each publish their own S3 server, which claims each upload was made up to
  3 s earlier, at the earliest at the put window's open (sim/forging_s3.py), and a gamer that trains one window in
  five and uploads zeros in the others.

Each gets ≤ 1 % of the weight the validator posts, the honest miners keep ≥ 95 % of it, and the authors they copy
keep their updates.  (One network for both families: each network costs a minute and a half of start-up and
windows on two cores.)"""
from __future__ import annotations

from dataclasses import replace

import pytest
from short_net import run_short_network

from sim import behaviours
from sim.localnet import LocalNet
from storage.commitment import BucketInfo, parse_commitment
from storage.gather import ReaderCache

WINDOWS = 12
FORGERS = ("backdater0", "hider0", "gamer0")
NEAR_COPIES = ("noisycopy0", "scaledcopy0", "mixer0", "replayer0")
ADVERSARIES = [("backdater", 1), ("hider", 1), ("gamer", 1),
               ("noisycopy", 1), ("scaledcopy", 1), ("mixer", 1), ("replayer", 1)]


def published_and_true_times(net: LocalNet, uid: int) -> tuple[str, list[tuple[float, float]]]:
    """The endpoint a peer published and, for each of its objects, (LastModified served there, LastModified
    the real S3 server gives for the same object)."""
    info = parse_commitment(net.chain.commitments()[uid])
    assert isinstance(info, BucketInfo), info
    readers = ReaderCache(allow_loopback=True)
    served = {o.key: o.last_modified for o in readers.get(info).list(info.bucket)}
    true = {o.key: o.last_modified for o in readers.get(replace(info, endpoint=net.s3.endpoint)).list(info.bucket)}
    return info.endpoint, [(served[k], true[k]) for k in sorted(served) if k in true]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, stdlib_corpus, network_hparams):
    def forged_times(net: LocalNet) -> tuple[dict, str]:
        return {n.name: published_and_true_times(net, n.uid) for n in net.nodes
                if n.behaviour in behaviours.FORGERS}, net.s3.endpoint

    report, lines, (forged, real_endpoint) = run_short_network(
        tmp_path_factory.mktemp("copies_and_forgers"), stdlib_corpus, network_hparams(), ADVERSARIES, WINDOWS,
        forged_times)
    return report, lines, forged, real_endpoint


def test_forgers_near_copies_and_the_gamer_get_no_weight(finished):
    report, _, _, _ = finished
    assert report["summary"]["good_share"] >= 0.95, report["peers"]
    by_name = {p["name"]: p for p in report["peers"]}
    for name in FORGERS + NEAR_COPIES:
        assert by_name[name]["weight"] <= 0.01, by_name[name]


def test_the_forgers_servers_did_forge(finished):
    """Both forgers published their own server, and objects read through it claim to be up to 3 s older than
    the real server says (sim.behaviours.forged_time): the validator was offered the forged times."""
    _, _, forged, real_endpoint = finished
    for name, (endpoint, times) in forged.items():
        assert endpoint != real_endpoint, name
        assert all(true - behaviours.BACKDATE_BY - 0.01 <= served <= true for served, true in times), (name, times)
        assert sum(served <= true - 1.0 for served, true in times) >= 3, (name, times)


def test_the_hider_is_late_whatever_it_claims(finished):
    """The hider uploads 1.4 s after the close (past ⌊close⌋ + 1.25 s, when the validator looks; before the gather
    at close + 1.5 s) and claims 1.4 s before it; the validator's own look at the close did not see it, so each
    upload it made is too late, never accepted.  (An upload landing before the look is judged by its LastModified:
    docs/scoring.md.)"""
    report, lines, _, _ = finished
    hider = next(str(p["uid"]) for p in report["peers"] if p["name"] == "hider0")
    verdicts = [line["rejections"].get(hider, "accepted") for line in lines]
    assert "accepted" not in verdicts and "duplicate" not in verdicts, verdicts
    assert verdicts.count("too_late") >= WINDOWS // 2, verdicts


def test_the_backdater_is_the_copy(finished):
    """The backdater copies the lowest uid (miner0) and claims it uploaded as the window opened; the validator
    times uploads by its own watch, so the backdater is the duplicate and miner0 keeps its update."""
    report, _, _, _ = finished
    by_name = {p["name"]: p for p in report["peers"]}
    assert by_name["backdater0"]["rejections"].get("duplicate", 0) >= 2, by_name["backdater0"]
    # that miner0 keeps its update: test_a_copied_author_keeps_its_update


def test_the_gamer_uploads_zeros_between_its_training_windows(finished):
    """The gamer trains only when window % 5 == 0; in the other windows it still uploads (zeros that pass the
    fast checks), and its pay stays ≤ 1 % above."""
    report, lines, _, _ = finished
    gamer = str(next(p["uid"] for p in report["peers"] if p["name"] == "gamer0"))
    present = [line["window"] for line in lines if line["rejections"].get(gamer) != "missing"]
    assert any(w % behaviours.GAMER_PERIOD for w in present), present


def test_each_near_copy_is_caught(finished):
    """Each copier did copy and was caught; in the other windows it had nothing to copy in time (missing) or,
    landing together with its source, proof of computation kept the source's update (as for the `copier` of
    tests/e2e/test_adversaries.py, a few windows where it picks wrong on this tiny model are allowed)."""
    report, _, _, _ = finished
    by_name = {p["name"]: p for p in report["peers"]}
    for name in NEAR_COPIES:
        got = by_name[name]["rejections"]
        assert got.get("duplicate", 0) >= 2, (name, got)
        assert got.get("duplicate", 0) + got.get("missing", 0) >= WINDOWS - 4, (name, got)


def test_a_copied_author_keeps_its_update(finished):
    """noisycopy, scaledcopy and the backdater copy the lowest uid (miner0): the validator saw miner0's upload a
    watch round earlier, so the author keeps its update in most windows it uploaded (docs/scoring.md, the watch)."""
    report, lines, _, _ = finished
    author = next(str(p["uid"]) for p in report["peers"] if p["name"] == "miner0")
    uploaded = [line for line in lines if line["rejections"].get(author) != "missing"]
    lost = [line["window"] for line in uploaded if line["rejections"].get(author) == "duplicate"]
    assert len(uploaded) >= WINDOWS // 2 and len(lost) <= 2, (len(uploaded), lost)


def test_honest_miners_are_never_late(finished):
    """The validator's look at the close never makes an honest miner late (docs/scoring.md, "Upload time")."""
    report, lines, _, _ = finished
    honest = {str(p["uid"]) for p in report["peers"] if p["behaviour"] == "honest"}
    timing = [(line["window"], u, r) for line in lines for u, r in line["rejections"].items()
              if u in honest and r in ("too_late", "too_early", "changed")]
    assert not timing, timing
    looks = [line["look"] for line in lines if line.get("look")]
    assert looks and all(look["started_after_close"] > 0 for look in looks)
