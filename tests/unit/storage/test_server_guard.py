"""The embedded S3 server's front door (storage/server.py ``_Guard``): which requests reach moto, and which app."""
from __future__ import annotations

import pytest

from storage.server import _Guard

BOOT, KEY = "AKIDBOOT0001", "AKIAPEER0001"


def signed(key: str, service: str) -> str:
    return (f"AWS4-HMAC-SHA256 Credential={key}/20261129/us-east-1/{service}/aws4_request, "
            "SignedHeaders=host;x-amz-date, Signature=00")


def call(guard: _Guard, path: str = "/dso-alice/object", auth: str = "") -> tuple[str, bytes]:
    seen: list[str] = []
    body = b"".join(guard({"PATH_INFO": path, "HTTP_AUTHORIZATION": auth}, lambda status, headers: seen.append(status)))
    return seen[0], body


@pytest.fixture
def guard() -> _Guard:
    def app(name: str):
        return lambda environ, start_response: (start_response("200 OK", []), [name.encode()])[1]
    return _Guard({"s3": app("s3"), "iam": app("iam")}, BOOT)


def test_each_signed_request_reaches_the_app_of_its_service(guard):
    guard.ready = True
    assert call(guard, auth=signed(KEY, "s3")) == ("200 OK", b"s3")
    assert call(guard, "/", auth=signed(KEY, "iam")) == ("200 OK", b"iam")


@pytest.mark.parametrize("path, auth, reason", [
    ("/dso-alice/object", "", "only SigV4-signed requests are accepted"),
    ("/dso-alice/object", "AWS AKIAPEER0001:c2lnbmF0dXJl", "only SigV4-signed requests are accepted"),
    ("/moto-api/reset", signed(KEY, "s3"), "moto control API is disabled"),
    ("/latest/meta-data/iam", signed(KEY, "s3"), "moto control API is disabled"),
    ("/", signed(KEY, "sts"), "service sts is not offered"),
])
def test_the_rest_is_refused_with_its_reason(guard, path, auth, reason):
    guard.ready = True
    status, body = call(guard, path, auth)
    assert status == "403 Forbidden" and f"<Message>{reason}</Message>".encode() in body


def test_until_ready_only_the_bootstrap_key_gets_in(guard):
    assert call(guard, auth=signed(KEY, "s3"))[1].endswith(b"<Message>server is starting</Message></Error>")
    assert call(guard, "/", auth=signed(BOOT, "iam")) == ("200 OK", b"iam")
