"""A peer's own S3 server that lies about time: a reverse proxy in front of a real S3 endpoint that replaces every
``LastModified`` it serves with a time of the forger's choosing (docs/scoring.md, "Upload times the peer cannot forge").

The ``backdater`` and ``hider`` adversaries (sim/behaviours/) publish this proxy's URL on chain instead of
the S3 endpoint they write to (``--storage.public_endpoint``).  Readers' requests pass through unchanged, Host
header included, so their SigV4 signatures still verify at the real server; only the answers change:

- the ``Last-Modified`` header of GET and HEAD answers;
- each ``<LastModified>`` element of a ListObjects answer.

Everything else (status, body, the other headers) is what the real server said.  The proxy is an experiment:
the core never imports it.
"""
from __future__ import annotations

import http.client
import logging
import re
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from email.utils import format_datetime, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("dso.sim.forging_s3")
_LISTED = re.compile(rb"<LastModified>([^<]{1,64})</LastModified>")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


Forge = Callable[[float], float]  # true unix time -> the time the server claims


def shifted_by(seconds: float) -> Forge:
    return lambda true: true + seconds


def forge_http_date(value: str, forge: Forge) -> str:
    """An RFC 7231 date (``Last-Modified``) replaced by its forgery; unparseable values are returned as they are."""
    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return value
    return format_datetime(datetime.fromtimestamp(forge(when), timezone.utc), usegmt=True)


def forge_iso_date(value: str, forge: Forge) -> str:
    """An ISO-8601 UTC time (``<LastModified>`` of a listing) replaced by its forgery, in the same layout."""
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return value
    moved = datetime.fromtimestamp(forge(when), timezone.utc)
    return moved.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moved.microsecond // 1000:03d}Z"


def forge_listing(body: bytes, forge: Forge) -> tuple[bytes, int]:
    """A ListObjects XML body with every ``<LastModified>`` forged; also how many were."""
    count = 0

    def forged(match: re.Match[bytes]) -> bytes:
        nonlocal count
        count += 1
        return b"<LastModified>" + forge_iso_date(match.group(1).decode("ascii", "replace"), forge).encode() + \
            b"</LastModified>"
    return _LISTED.sub(forged, body), count


class ForgingS3:
    """Serve ``upstream`` (an ``http://host:port`` S3 endpoint) on a loopback port with every LastModified
    replaced by ``forge(true time)``.  ``forged`` counts the timestamps it replaced."""

    def __init__(self, upstream: str, forge: Forge, host: str = "127.0.0.1", port: int = 0):
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream {upstream!r}: an http://host:port endpoint")
        self.upstream = (parts.hostname, parts.port or 80)
        self.forge = forge
        self.forged = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="forging-s3", daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host.decode() if isinstance(host, bytes) else host}:{port}"

    def start(self) -> ForgingS3:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ForgingS3:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _count(self, n: int) -> None:
        with self._lock:
            self.forged += n

    def forward(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
                ) -> tuple[int, list[tuple[str, str]], bytes]:
        """The real server's answer to the request, with its times moved."""
        conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:  # verbatim, Host included: the signature covers them
                conn.putheader(name, value)
            conn.endheaders(body or None)
            resp = conn.getresponse()
            status, out, data = resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()
        changed = 0
        answer = []
        for name, value in out:
            if name.lower() in _HOP_BY_HOP and not (method == "HEAD" and name.lower() == "content-length"):
                continue  # the relay sets the body's length itself (a HEAD answer keeps the object's)
            if name.lower() == "last-modified":
                value, changed = forge_http_date(value, self.forge), changed + 1
            answer.append((name, value))
        if b"<LastModified>" in data:
            data, listed = forge_listing(data, self.forge)
            changed += listed
        self._count(changed)
        return status, answer, data

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length > 0 else b""
                try:
                    status, headers, data = proxy.forward(self.command, self.path, list(self.headers.items()), body)
                except OSError as e:
                    self.send_error(502, f"upstream: {e}")
                    return
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = relay

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
                log.debug("forging S3: " + format, *args)

        return Handler
