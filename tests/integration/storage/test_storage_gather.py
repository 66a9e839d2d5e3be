"""Gather: 32 peers on the embedded server (auth on), plus hostile fake servers on loopback."""
from __future__ import annotations

import email.utils
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from dso.protocol.clock import PutWindow
from dso.protocol.payload import Payload
from dso.protocol.rejections import Reason
from st_craft import honest, hostile
from storage import keys
from storage.commitment import BucketInfo
from storage.gather import GatherOptions, ReaderCache, gather
from storage.wire import Expect, payload_size_cap

WINDOW = 6
FORMAT_REASONS = ["malformed", "bad_keys", "bad_dtype", "bad_shape", "index_out_of_range", "wrong_count",
                  "bad_encoding", "non_finite", "metadata_mismatch"]


def _wait_past(server_second: float, gap: float) -> None:
    time.sleep(max(0.0, server_second + gap - time.time()))


def test_gather_32_peers_returns_exactly_the_honest_ones(s3, codec, make_update, hp):
    peers_creds = {uid: s3.provision(f"peer{uid}") for uid in range(31)}
    v = hp.protocol_version
    honest_uids = list(range(17))
    plan = {17: "unreachable", 18: "missing", 19: "too_early", 20: "too_late", 21: "too_large"}
    plan.update({22 + i: reason for i, reason in enumerate(FORMAT_REASONS)})   # uids 22..30
    assert max(plan) == 30

    def put(uid: int, data: bytes) -> float:
        c = peers_creds[uid]
        w = c.write_client()
        w.put(c.bucket, keys.gradient(WINDOW, uid, v), data)
        return w.head(c.bucket, keys.gradient(WINDOW, uid, v)).last_modified

    updates = {uid: make_update(100 + uid) for uid in range(31)}
    # phase 1: an early upload; phase 2 (>= 2 s later): the put window; phase 3 (>= 1 s later): a late one
    lm_early = put(19, honest(codec, updates[19], hp, 19, WINDOW))
    _wait_past(lm_early, 2.05)
    downloaded = 0
    lm_start = put(0, honest(codec, updates[0], hp, 0, WINDOW))
    downloaded += len(honest(codec, updates[0], hp, 0, WINDOW))
    lm_end = lm_start
    for uid in honest_uids[1:]:
        data = honest(codec, updates[uid], hp, uid, WINDOW)
        downloaded += len(data)
        lm_end = max(lm_end, put(uid, data))
    for uid, reason in plan.items():
        if reason in ("unreachable", "missing", "too_early", "too_late"):
            continue
        data = hostile(codec, updates[uid], hp, uid, WINDOW)[reason]
        downloaded += 0 if reason == "too_large" else len(data)
        lm_end = max(lm_end, put(uid, data))
    _wait_past(lm_end, 1.05)
    assert put(20, honest(codec, updates[20], hp, 20, WINDOW)) > lm_end

    commitments: dict[int, object] = {uid: c.commitment() for uid, c in peers_creds.items()}
    commitments[17] = BucketInfo(s3.endpoint, "us-east-1", peers_creds[17].bucket, peers_creds[16].read_key_id,
                                 peers_creds[16].read_secret)   # someone else's read key: access denied
    commitments[31] = "dso1|not a url|us-east-1|dso-x|K|S"
    commitments[32] = None
    put_window = PutWindow(WINDOW, open=lm_start, close=lm_end + 0.5)
    result = gather(WINDOW, commitments, codec, Expect.from_hparams(hp, WINDOW), put_window, deadline_seconds=60,
                    options=GatherOptions(max_workers=16, readers=ReaderCache(timeout=20, allow_loopback=True)))

    assert sorted(result.payloads) == honest_uids
    want = {uid: reason for uid, reason in plan.items()}
    want[31], want[32] = "bad_commitment", "missing"
    assert {uid: r.reason.value for uid, r in result.rejections.items()} == want
    assert result.bytes_down == downloaded
    for uid in (0, 16):
        got = result.payloads[uid]
        assert got.meta.uid == uid and lm_start <= got.last_modified <= lm_end
        assert all(torch.equal(got.update[n].idx, u.idx) for n, u in updates[uid].items())


# ------------------------------------------------------- hostile servers
class _Fake(BaseHTTPRequestHandler):
    """Scripted S3 impostor: behaviour chosen per server."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def _headers(self, length: int | None, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Last-Modified", email.utils.formatdate(time.time(), usegmt=True))
        self.send_header("ETag", '"abc"')
        if length is not None:
            self.send_header("Content-Length", str(length))
        else:
            self.send_header("Connection", "close")
        self.end_headers()

    def do_HEAD(self):
        self.server.calls += 1
        mode = self.server.mode
        if (mode == "flaky" and self.server.calls <= 2) or mode == "broken":
            return self._headers(0, 503)
        self._headers(len(self.server.body) if mode == "flaky" else 100)

    def do_GET(self):
        self.server.calls += 1
        mode, body = self.server.mode, self.server.body
        if mode == "announces_huge":
            self._headers(len(body) * 100)
            self.wfile.write(body[:10])
        elif mode == "streams_huge":            # no Content-Length: only the bytes read can tell
            self.close_connection = True
            self._headers(None)
            for _ in range(100):
                self.wfile.write(body)
        elif mode == "broken":
            self._headers(0, 500)
        else:
            self._headers(len(body))
            self.wfile.write(body)


def _serve(mode: str, body: bytes) -> tuple[ThreadingHTTPServer, BucketInfo]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    srv.daemon_threads = True
    srv.mode, srv.body, srv.calls = mode, body, 0
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, BucketInfo(f"http://127.0.0.1:{srv.server_address[1]}", "us-east-1", "dso-fake", "AKIAFAKE", "s" * 40)


@pytest.fixture(scope="module")
def fair(s3, codec, make_update, hp):
    creds = s3.provision("fair")
    creds.write_client().put(creds.bucket, keys.gradient(WINDOW, 0, hp.protocol_version),
                             honest(codec, make_update(1), hp, 0, WINDOW))
    return creds


def test_hostile_servers_are_rejections_and_a_hanging_one_only_costs_the_deadline(fair, codec, make_update, hp):
    cap = payload_size_cap(codec, hp.sync_samples)
    good_for = lambda uid: honest(codec, make_update(uid), hp, uid, WINDOW)  # noqa: E731
    servers = {1: _serve("announces_huge", good_for(1)), 2: _serve("streams_huge", good_for(2)),
               3: _serve("flaky", good_for(3)), 4: _serve("broken", b"")}
    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(16)   # accepts connections in the kernel, never answers
    peers = {0: fair.commitment(), **{uid: info for uid, (_, info) in servers.items()},
             5: BucketInfo(f"http://127.0.0.1:{hang.getsockname()[1]}", "us-east-1", "dso-hang", "AKIAFAKE", "s" * 40)}
    readers = ReaderCache(timeout=30, max_attempts=3, allow_loopback=True)
    try:
        started = time.monotonic()
        result = gather(WINDOW, peers, codec, Expect.from_hparams(hp, WINDOW), None, deadline_seconds=8,
                        options=GatherOptions(readers=readers))
        elapsed = time.monotonic() - started
    finally:
        hang.close()
        for srv, _ in servers.values():
            srv.shutdown()
    assert sorted(result.payloads) == [0, 3]
    assert servers[3][0].calls >= 3                     # two 503s were retried, then it served
    reasons = {uid: r.reason for uid, r in result.rejections.items()}
    assert reasons == {1: Reason.TOO_LARGE, 2: Reason.TOO_LARGE, 4: Reason.UNREACHABLE, 5: Reason.TIMEOUT}
    assert result.bytes_down <= 2 * (cap + 256 * 1024) + 2 * len(good_for(0))
    # the hanging peer's socket would block for 3 x 30 s; gather must not wait for it
    assert elapsed < 25 and isinstance(result.payloads[0], Payload)


def test_gather_window_times_each_peer(fair, codec, hp):
    """Per-peer seconds for the metrics: a fetched peer its own time, a peer cut off by its deadline about the
    whole budget, a peer never fetched (no commitment) none."""
    from storage.reveal import gather_window

    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(16)
    peers = {0: fair.commitment(), 5: BucketInfo(f"http://127.0.0.1:{hang.getsockname()[1]}", "us-east-1",
                                                 "dso-hang", "AKIAFAKE", "s" * 40), 6: None}
    try:
        result = gather_window(WINDOW, peers, codec, Expect.from_hparams(hp, WINDOW), PutWindow(WINDOW, 0, 1e12),
                               6.0, GatherOptions(readers=ReaderCache(timeout=30, allow_loopback=True)))
    finally:
        hang.close()
    seconds = result.peer_seconds
    assert sorted(result.payloads) == [0] and result.rejections[5].reason == Reason.TIMEOUT
    assert set(seconds) == {0, 5}
    # the silent peer is cut at its own deadline, which the fair schedule sets at about the whole budget (6 s: room
    # for the honest GET and the workers' start on a loaded machine)
    assert 0 < seconds[0] < 6.0 and 4.5 <= seconds[5] <= result.seconds + 0.05
