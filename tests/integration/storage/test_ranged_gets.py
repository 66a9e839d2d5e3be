"""storage.ranged against an HTTP server that misbehaves: a ranged GET reads at most what it asked for, and every
failure is a StorageError of the kind botocore's would be (the S3 engines' behaviour: test_remote_data.py)."""
from __future__ import annotations

import threading
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


def reader(endpoint: str, key: str = "") -> RangedGets:
    client = S3Client(endpoint, access_key_id=key, secret_access_key="secret" if key else "",
                      use_environment=False, timeout=5)
    return RangedGets(client.signed_get, timeout=5)


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
