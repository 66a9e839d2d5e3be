"""Stalled and slow-drip endpoints must not starve honest peers, and every
thread and socket of a gather is released when it returns.  Impostors run in a child process
(scripts/benchmarks/hostile_server.py) so the sockets counted here are the reader's own."""
from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from repo import ROOT

sys.path.append(str(ROOT / "scripts" / "benchmarks"))
import hostile_server  # noqa: E402

from dso.protocol.rejections import Reason  # noqa: E402
from st_craft import honest  # noqa: E402
from storage import keys  # noqa: E402
from storage.commitment import BucketInfo  # noqa: E402
from storage.gather import GatherOptions, ReaderCache, gather  # noqa: E402
from storage.peer_client import PeerClient  # noqa: E402
from storage.schedule import ordered, peer_share  # noqa: E402
from storage.wire import Expect  # noqa: E402

WINDOW = 9
N_HONEST = 8


@pytest.fixture(scope="module")
def honest_peers(s3, codec, make_update, hp):
    """uid 100.. → commitment of a moto-backed peer holding an honest payload for WINDOW."""
    out = {}
    for i in range(N_HONEST):
        uid = 100 + i
        creds = s3.provision(f"fair{i}")
        creds.write_client().put(creds.bucket, keys.gradient(WINDOW, uid, hp.protocol_version),
                                 honest(codec, make_update(uid), hp, uid, WINDOW))
        out[uid] = creds.commitment()
    return out


def _impostors(mode: str, count: int, body_bytes: int = 1000):
    process, ports = hostile_server.start(mode, count, body_bytes)
    infos = {uid: BucketInfo(f"http://127.0.0.1:{port}", "us-east-1", "dso-evil", "AKIAEVIL", "s" * 40)
             for uid, port in enumerate(ports)}
    return process, infos


def _sockets() -> int:
    fds = os.listdir("/proc/self/fd")
    count = 0
    for fd in fds:
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count


def _gather_threads() -> int:
    return sum(t.name.startswith("dso-gather") for t in threading.enumerate())


def test_sixteen_stalled_endpoints_do_not_starve_honest_peers(honest_peers, codec, hp):
    """Uids 0-15 accept TCP and never answer; with 16 workers the old gather spent the whole
    budget on them and every honest peer after them was a TIMEOUT (16 s: the honest peers' GETs come after the
    stalled ones' shares, and must fit in what is left on a loaded machine)."""
    process, stalled = _impostors("stall", 16)
    try:
        result = gather(WINDOW, {**stalled, **honest_peers}, codec, Expect.from_hparams(hp, WINDOW), None,
                        deadline_seconds=16,
                        options=GatherOptions(max_workers=16, readers=ReaderCache(allow_loopback=True)))
    finally:
        hostile_server.stop(process)
    assert sorted(result.payloads) == sorted(honest_peers)
    assert {uid: r.reason for uid, r in result.rejections.items()} == {uid: Reason.TIMEOUT for uid in stalled}


@pytest.mark.parametrize("mode", ["drip", "crawl"])
def test_slow_drip_endpoints_are_cut_at_their_deadline_and_release_everything(honest_peers, codec, hp, mode):
    """An endpoint sending one byte every 0.5 s held a thread and a socket for hours (the
    deadline was checked only between 256 KiB reads).  Now each is cut at its deadline, honest peers
    (given first by standing) all finish before any impostor, and nothing outlives the call."""
    process, drips = _impostors(mode, 12)
    sockets_before, threads_before = _sockets(), threading.active_count()
    try:
        started = time.monotonic()
        result = gather(WINDOW, {**drips, **honest_peers}, codec, Expect.from_hparams(hp, WINDOW), None,
                        deadline_seconds=12, options=GatherOptions(max_workers=8, priority=sorted(honest_peers),
                                                                  readers=ReaderCache(allow_loopback=True)))
        elapsed = time.monotonic() - started
        sockets_after, threads_after, gather_threads = _sockets(), threading.active_count(), _gather_threads()
    finally:
        hostile_server.stop(process)
    assert sorted(result.payloads) == sorted(honest_peers)
    assert {uid: r.reason for uid, r in result.rejections.items()} == {uid: Reason.TIMEOUT for uid in drips}
    assert gather_threads == 0 and threads_after == threads_before
    assert sockets_after == sockets_before
    assert elapsed < 12 + 2.0 + 1.0  # budget + join grace + slack: not the hours a drip would take
    # honest peers started first and none waited for an impostor
    assert max(result.finished[u] for u in honest_peers) < min(result.finished.get(u, 99.0) for u in drips)


def test_a_drip_is_cut_inside_a_read_not_between_reads():
    """One GET against a drip endpoint with a 1.5 s deadline ends by the deadline (the old client read
    256 KiB before looking at the clock: 60,000 bytes at 2 bytes/s is more than eight hours)."""
    process, infos = _impostors("drip", 1)
    client = PeerClient(infos[0], ReaderCache(allow_loopback=True).policy, timeout=30)
    try:
        started = time.monotonic()
        with pytest.raises(Exception) as caught:
            client.get_with_info("dso-evil", "k", max_bytes=10 ** 6, deadline=started + 1.5)
        elapsed = time.monotonic() - started
    finally:
        hostile_server.stop(process)
    assert getattr(caught.value, "kind", None) == "timeout"
    assert 1.4 < elapsed < 1.5 + 3.0  # the deadline and a loaded machine's wake-up, not the read's hours


# ------------------------------------------------------------ the schedule, pure
def test_peer_share_splits_what_is_left_fairly():
    assert peer_share(8.0, 16, 48, 1.0) == pytest.approx(8.0 * 16 / 48)
    assert peer_share(8.0, 16, 4, 1.0) == 8.0               # fewer peers than workers: all of it
    assert peer_share(8.0, 16, 1000, 1.0) == 1.0            # never below the floor ...
    assert peer_share(0.5, 16, 1000, 1.0) == 0.5            # ... nor beyond the budget
    assert peer_share(0.0, 16, 10, 1.0) == 0.0


def test_ordered_puts_priority_first_then_uids():
    assert ordered({5: 0, 1: 0, 9: 0, 3: 0}, [9, 7, 3, 9]) == [9, 3, 1, 5]
    assert ordered([4, 2, 0], None) == [0, 2, 4]


def test_peer_client_reads_what_botocore_reads(s3):
    """HEAD, GET and a paginated LIST through PeerClient agree with the botocore client on moto."""
    creds = s3.provision("pclist")
    writer = creds.write_client()
    for i in range(3):
        writer.put(creds.bucket, f"ledger/{i}-v1.json", b"x" * (i + 1))
    writer.put(creds.bucket, "other/key with space", b"y")
    peer = ReaderCache(allow_loopback=True).get(creds.read_info())
    ours = [(o.key, o.size, int(o.last_modified)) for o in peer.list(creds.bucket, "ledger/")]
    theirs = [(o.key, o.size, int(o.last_modified)) for o in creds.read_client().list(creds.bucket, "ledger/")]
    assert ours == theirs and len(ours) == 3
    assert peer.get(creds.bucket, "other/key with space") == b"y"
    assert peer.head(creds.bucket, "ledger/2-v1.json").size == 3
    with pytest.raises(Exception) as caught:
        peer.get(creds.bucket, "ledger/absent")
    assert getattr(caught.value, "kind", None) == "missing"
    with pytest.raises(Exception) as caught:
        peer.get(creds.bucket, "ledger/2-v1.json", max_bytes=2)
    assert getattr(caught.value, "kind", None) == "too_large"
