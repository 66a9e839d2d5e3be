"""storage.ranged against an HTTP server that misbehaves: a ranged GET reads at most what it asked for, and every
failure is a StorageError of the kind botocore's would be (the S3 engines' behaviour: test_remote_data.py)."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from storage.client import S3Client, StorageError
from storage.ranged import RangedGets

BODY = bytes(range(256)) * 64  # 16 KiB


class Handler(BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_GET(self):  # noqa: N802 — http.server's name
        Handler.seen.append(dict(self.headers.items()))
        mode = self.path.rsplit("/", 1)[-1]
        if mode == "stalls":  # the status line and headers, then nothing for longer than the client waits
            self.send_response(206)
            self.send_header("Content-Length", "64")
            self.end_headers()
            self.wfile.flush()
            time.sleep(4)
            return
        start, stop = (int(x) for x in self.headers["Range"].removeprefix("bytes=").split("-"))
        status, body = {"ok": (206, BODY[start:stop + 1]), "more": (206, BODY[start:stop + 100]),
                        "whole": (200, BODY), "missing": (404, b""), "denied": (403, b""),
                        "busy": (503, b"")}[mode]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def reader(endpoint: str, key: str = "", timeout: float = 5, clock=time.monotonic) -> RangedGets:
    client = S3Client(endpoint, access_key_id=key, secret_access_key="secret" if key else "",
                      use_environment=False, timeout=timeout)
    return RangedGets(client.signed_get, timeout=timeout, clock=clock)


def test_a_range_is_read_signed_or_unsigned(endpoint):
    Handler.seen.clear()
    assert reader(endpoint, "AKIDTEST").get("bucket", "dir/ok", 100, 50) == BODY[100:150]
    assert reader(endpoint).get("bucket", "dir/ok", 16_000, 1000) == BODY[16_000:]   # fewer at the end
    signed, unsigned = Handler.seen
    assert signed["Range"] == "bytes=100-149"
    assert signed["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDTEST/")
    assert "Authorization" not in unsigned


@pytest.mark.parametrize("mode, kind", [("more", "too_large"), ("whole", "unavailable"), ("missing", "missing"),
                                        ("denied", "denied"), ("busy", "unavailable")])
def test_a_server_that_misbehaves_is_a_storage_error(endpoint, mode, kind):
    with pytest.raises(StorageError) as e:
        reader(endpoint).get("bucket", f"dir/{mode}", 0, 64)
    assert e.value.kind == kind
    assert "GET bucket/dir/" in str(e.value) and "bytes 0-63" in str(e.value)


def test_an_endpoint_that_does_not_answer_is_unavailable():
    with pytest.raises(StorageError) as e:
        reader("http://127.0.0.1:9").get("bucket", "ok", 0, 64)    # the discard port: nothing listens
    assert e.value.kind == "unavailable" and e.value.retryable


def test_one_signature_serves_every_range_of_an_object_until_it_is_old(endpoint):
    now = [0.0]
    ranges = reader(endpoint, "AKIDTEST", clock=lambda: now[0])
    Handler.seen.clear()
    assert ranges.get("bucket", "dir/ok", 0, 10) == BODY[:10]
    assert ranges.get("bucket", "dir/ok", 500, 10) == BODY[500:510]
    assert ranges.get("bucket", "other/ok", 0, 10) == BODY[:10]
    now[0] = ranges.resign_after + 1
    assert ranges.get("bucket", "dir/ok", 0, 10) == BODY[:10]
    first, second, other, _ = (h["Authorization"] for h in Handler.seen)
    assert first == second and other != first  # (the key is in the signature)
    assert "SignedHeaders=host;x-amz-content-sha256;x-amz-date," in first  # the range is sent unsigned
    assert [h["Range"] for h in Handler.seen] == ["bytes=0-9", "bytes=500-509", "bytes=0-9", "bytes=0-9"]
    assert (ranges.signed, ranges.requests) == (3, 4)  # signed again once old (the same second: the same text)


def test_threads_read_at_once_each_on_its_own_connection(endpoint):
    ranges = reader(endpoint, "AKIDTEST")
    starts = list(range(0, 16_000, 250))
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda s: ranges.get("bucket", "dir/ok", s, 300), starts))
    assert got == [BODY[s:s + 300] for s in starts]
    assert ranges.signed == 1


def test_a_body_that_stops_coming_is_a_timeout(endpoint):
    started = time.monotonic()
    with pytest.raises(StorageError) as e:
        reader(endpoint, timeout=1).get("bucket", "dir/stalls", 0, 64)
    assert e.value.kind == "timeout" and "bytes 0-63" in str(e.value)
    assert time.monotonic() - started < 3.5  # gave up before the server's 4 s stall ended
