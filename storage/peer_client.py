"""Read-only S3 access to *another party's* bucket, on terms the reader sets (docs/storage.md, "Reading peers").

:class:`storage.client.S3Client` (botocore) is for our own bucket.  A peer's bucket is reached
through an endpoint the peer chose, so reads of it are made here instead:

* **one deadline per request, enforced inside every socket operation**: connect, the TLS handshake,
  sending, and each ``recv`` are given the time left until the deadline (never more than the
  per-operation ``timeout``), so an endpoint that drips one byte every 0.5 s is cut at the deadline
  rather than after hours; botocore's timeouts apply per ``recv`` and would never fire;
* **the address connected to is the one checked** (:mod:`storage.endpoints`): the name is resolved
  once per request, every address is checked, and the socket connects to that address (TLS still
  verifies the certificate against the host name); a refused endpoint raises
  ``StorageError("refused")``;
* **no redirects** (a 3xx is an error), bounded retries (5xx, 429, dropped connections) that never
  outlive the deadline, one connection per request, always closed.

Requests are SigV4-signed with botocore's signer (path-style addressing).  Bodies of errors and
listings are capped before they are parsed.
"""
from __future__ import annotations

import email.utils
import http.client
import re
import socket
import ssl
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote, urlencode, urlsplit

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from storage.client import ObjectInfo, StorageError
from storage.commitment import BucketInfo
from storage.endpoints import STRICT, EndpointPolicy, EndpointRefused, resolve

READ_CHUNK = 64 * 1024
ERROR_BODY_CAP = 8 * 1024            # S3 error documents are a few hundred bytes
LIST_PAGE_CAP = 4 * 1024 * 1024      # one ListObjectsV2 page of 1000 keys is ~300 KB
_RETRY_STATUS = {429, 500, 502, 503, 504}
_CODE = re.compile(rb"<Code>([A-Za-z0-9.]{1,64})</Code>")
_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


if TYPE_CHECKING:  # the mix-in only ever sits in front of a socket class
    _SocketBase = socket.socket
else:
    _SocketBase = object


class _Deadline(_SocketBase):
    """Mix-in for sockets: every blocking call gets the time left until ``deadline`` (≤ ``op_timeout``)."""

    deadline: float = float("inf")
    op_timeout: float = 10.0

    def _arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request deadline passed")
        self.settimeout(min(left, self.op_timeout))

    def recv_into(self, *args: Any, **kw: Any) -> int:
        self._arm()
        return super().recv_into(*args, **kw)

    def recv(self, *args: Any, **kw: Any) -> bytes:
        self._arm()
        return super().recv(*args, **kw)

    def sendall(self, *args: Any, **kw: Any) -> None:
        self._arm()
        return super().sendall(*args, **kw)


class _DeadlineSocket(_Deadline, socket.socket):
    pass


class _DeadlineSSLSocket(_Deadline, ssl.SSLSocket):
    pass


def _tls_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.sslsocket_class = _DeadlineSSLSocket
    return ctx


_TLS = _tls_context()


class PeerClient:
    """Read-only, deadline-bounded S3 client for one peer's :class:`BucketInfo` (thread-safe)."""

    def __init__(self, info: BucketInfo, policy: EndpointPolicy = STRICT, timeout: float = 10.0,
                 max_attempts: int = 3):
        if timeout <= 0 or max_attempts < 1:
            raise ValueError("timeout must be > 0 and max_attempts >= 1")
        parts = urlsplit(info.endpoint)
        self.scheme, self.host = parts.scheme, parts.hostname or ""
        self.port = parts.port or (443 if self.scheme == "https" else 80)
        default_port = (self.scheme == "https" and self.port == 443) or (self.scheme == "http" and self.port == 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.netloc = host if default_port else f"{host}:{self.port}"
        self.endpoint, self.region, self.access_key_id = info.endpoint, info.region, info.access_key_id
        self.policy, self.timeout, self.max_attempts = policy, timeout, max_attempts
        self._signer = S3SigV4Auth(Credentials(info.access_key_id, info.secret_access_key), "s3", info.region)
        self._lock = threading.Lock()
        self.bytes_down = 0

    # ------------------------------------------------------------ public reads
    def head(self, bucket: str, key: str, deadline: float | None = None) -> ObjectInfo:
        status, headers, _ = self._request("HEAD", bucket, key, {}, deadline, 0, f"HEAD {bucket}/{key}")
        return _info(key, headers)

    def get(self, bucket: str, key: str, max_bytes: int | None = None, deadline: float | None = None) -> bytes:
        return self.get_with_info(bucket, key, max_bytes, deadline)[0]

    def get_with_info(self, bucket: str, key: str, max_bytes: int | None = None,
                      deadline: float | None = None) -> tuple[bytes, ObjectInfo]:
        """An object's bytes, never more than ``max_bytes`` (whatever the server announced) and never
        past ``deadline`` (``time.monotonic()``; None: only the per-operation timeout applies)."""
        _, headers, body = self._request("GET", bucket, key, {}, deadline, max_bytes, f"GET {bucket}/{key}")
        return body, _info(key, headers, size=len(body))

    def list(self, bucket: str, prefix: str = "", limit: int = 100_000,
             deadline: float | None = None) -> list[ObjectInfo]:
        out: list[ObjectInfo] = []
        token = None
        while len(out) < limit:
            query = {"list-type": "2", "prefix": prefix, **({"continuation-token": token} if token else {})}
            _, _, body = self._request("GET", bucket, "", query, deadline, LIST_PAGE_CAP, f"LIST {bucket}/{prefix}")
            page, token = _parse_listing(body, f"LIST {bucket}/{prefix}")
            out += page
            if not token:
                break
        return out[:limit]

    # ------------------------------------------------------------ transport
    def _request(self, method: str, bucket: str, key: str, query: dict[str, str], deadline: float | None,
                 max_bytes: int | None, what: str) -> tuple[int, http.client.HTTPMessage, bytes]:
        """One request with retries; raises StorageError (kinds as in storage.client, plus ``refused``)."""
        path = "/" + quote(bucket, safe="") + ("/" + quote(key, safe="/~") if key else "")
        target = path + ("?" + urlencode(sorted(query.items()), quote_via=quote) if query else "")
        last: StorageError | None = None
        for attempt in range(self.max_attempts):
            if attempt:
                pause = min(0.1 * 2 ** (attempt - 1), 1.0)
                if deadline is not None and time.monotonic() + pause >= deadline:
                    break
                time.sleep(pause)
            try:
                return self._once(method, target, deadline, max_bytes, what)
            except StorageError as e:
                if not e.retryable:
                    raise
                last = e
        raise last or StorageError("timeout", f"{what}: deadline passed before a retry")

    def _once(self, method: str, target: str, deadline: float | None, max_bytes: int | None,
              what: str) -> tuple[int, http.client.HTTPMessage, bytes]:
        limit = deadline if deadline is not None else float("inf")
        if time.monotonic() >= limit:
            raise StorageError("timeout", f"{what}: deadline passed before the request")
        try:
            addresses = resolve(self.host, self.port, self.scheme, self.policy)
        except EndpointRefused as e:
            raise StorageError("refused", f"{what}: endpoint refused: {e}") from None
        request = AWSRequest(method=method, url=f"{self.scheme}://{self.netloc}{target}",
                             headers={"Host": self.netloc})
        self._signer.add_auth(request)
        sock = conn = resp = None
        try:
            sock = self._connect(addresses, limit)
            conn = http.client.HTTPConnection(self.host, self.port)
            conn.sock = sock
            conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in request.headers.items():
                conn.putheader(name, value)
            conn.putheader("Connection", "close")
            conn.endheaders()
            resp = conn.getresponse()
            if resp.status >= 300:
                raise _status_error(resp, what)
            body = b"" if method == "HEAD" else self._read_body(resp, max_bytes, what)
            return resp.status, resp.msg, body
        except StorageError:
            raise
        except TimeoutError as e:
            raise StorageError("timeout", f"{what}: {e or 'timed out'}",
                               retryable=time.monotonic() < limit) from None
        except ssl.SSLCertVerificationError as e:
            raise StorageError("unavailable", f"{what}: TLS certificate refused ({e.verify_message})") from None
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise StorageError("unavailable", f"{what}: {type(e).__name__}: {str(e)[:120]}", retryable=True) from None
        finally:  # the response holds a file on the socket: close it first, or the socket stays open
            for thing in (resp, conn, sock):
                if thing is not None:
                    thing.close()

    def _connect(self, addresses: Sequence[tuple[int, Any]], limit: float) -> socket.socket:
        error: Exception | None = None
        for family, sockaddr in addresses:
            sock = _DeadlineSocket(family, socket.SOCK_STREAM)
            sock.deadline, sock.op_timeout = limit, self.timeout
            try:
                sock._arm()
                sock.connect(sockaddr)
                if self.scheme != "https":
                    return sock
                sock._arm()  # the handshake runs under the socket's timeout: what is left of the deadline
                # handshake bounded by the timeout set; the context makes _DeadlineSSLSocket (sslsocket_class)
                tls = cast(_DeadlineSSLSocket, _TLS.wrap_socket(sock, server_hostname=self.host))
                tls.deadline, tls.op_timeout = limit, self.timeout
                return tls
            except Exception as e:  # noqa: BLE001 — try the next address, report the last failure
                sock.close()
                error = e
        raise error if error is not None else OSError("no address to connect to")

    def _read_body(self, resp: http.client.HTTPResponse, max_bytes: int | None, what: str) -> bytes:
        announced = resp.getheader("Content-Length")
        if max_bytes is not None and announced is not None and announced.isdigit() and int(announced) > max_bytes:
            raise StorageError("too_large", f"{what}: {announced} bytes announced, cap {max_bytes}")
        parts, total = [], 0
        while True:
            chunk = resp.read(READ_CHUNK)
            if not chunk:
                break
            total += len(chunk)
            with self._lock:
                self.bytes_down += len(chunk)
            if max_bytes is not None and total > max_bytes:
                raise StorageError("too_large", f"{what}: body exceeds cap {max_bytes}")
            parts.append(chunk)
        return b"".join(parts)


def _status_error(resp: http.client.HTTPResponse, what: str) -> StorageError:
    status = resp.status
    try:
        match = _CODE.search(resp.read(ERROR_BODY_CAP))
    except Exception:  # noqa: BLE001 — the error body is a courtesy
        match = None
    code = match.group(1).decode() if match else str(status)
    if 300 <= status < 400:
        err = StorageError("unavailable", f"{what}: redirect {status} to {str(resp.getheader('Location'))[:80]!r} "
                                          "not followed", status)
    elif status == 404 or code in ("NoSuchKey", "NoSuchBucket", "NotFound"):
        err = StorageError("missing", f"{what}: not found ({code})", status)
    elif status in (401, 403):
        err = StorageError("denied", f"{what}: access denied ({code})", status)
    else:
        err = StorageError("unavailable", f"{what}: {code}", status, retryable=status in _RETRY_STATUS)
    return err


def _info(key: str, headers: http.client.HTTPMessage, size: int | None = None) -> ObjectInfo:
    modified = headers.get("Last-Modified")
    try:
        stamp = email.utils.parsedate_to_datetime(modified).timestamp() if modified else float("nan")
    except (TypeError, ValueError):
        stamp = float("nan")
    length = headers.get("Content-Length", "0")
    return ObjectInfo(key, int(length) if size is None and length.isdigit() else (size or 0), stamp,
                      str(headers.get("ETag", "")).strip('"'))


def _parse_listing(body: bytes, what: str) -> tuple[list[ObjectInfo], str | None]:
    try:
        root = ET.fromstring(body)  # expat >= 2.4.1 refuses entity expansion bombs; the body is capped
    except ET.ParseError as e:
        raise StorageError("unavailable", f"{what}: unparsable listing ({e})") from None

    def text(node: ET.Element, name: str) -> str:
        child = node.find(_NS + name)
        if child is None:
            child = node.find(name)
        return (child.text or "") if child is not None else ""

    out = []
    for item in list(root.iter(_NS + "Contents")) + list(root.iter("Contents")):
        try:
            stamp = datetime.fromisoformat(text(item, "LastModified").replace("Z", "+00:00")).timestamp()
            size = int(text(item, "Size") or 0)
        except ValueError:
            raise StorageError("unavailable", f"{what}: malformed listing entry") from None
        out.append(ObjectInfo(text(item, "Key"), size, stamp, text(item, "ETag").strip('"')))
    truncated = text(root, "IsTruncated") == "true"
    return out, (text(root, "NextContinuationToken") or None) if truncated else None
