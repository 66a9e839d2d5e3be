"""Ranged GETs at a fraction of botocore's CPU: libcurl (pycurl) sends them, each object's signature is reused.

A miner reading its corpus from a bucket makes about one 64 KiB ranged GET per sequence (500 a window), and
on a machine with no idle core their CPU is taken from training. Through a botocore client each cost about
3 ms of CPU; signed by botocore's SigV4 signer and sent through urllib3, 0.7-0.9 ms (Python's HTTP parsing);
sent by libcurl, whose transfer runs in C without the GIL, with a signature reused, about 0.2 ms
(docs/decisions/0501-ranged-gets-with-libcurl.md).

The signature: :meth:`storage.client.S3Client.signed_get` signs a GET of the whole object (host and the
``x-amz-*`` headers, as SigV4 requires), and the ``Range`` header is sent unsigned beside it, so one signature
serves every range of that object until it is ``resign_after`` seconds old (S3 accepts a request's date up
to 15 minutes off). Leaving the range unsigned gives an eavesdropper nothing a signed range would not:
whoever can replay the request reads the same public-to-the-key object, and every chunk is checked against
its digest by the reader (:mod:`dso.data.remote_shards`).

Each thread has its own curl handle (and so its own kept-alive connection). Failures become
:class:`storage.client.StorageError` with the same kinds botocore's do; a body is never read past the
``length`` asked for (plus at most one 16 KiB piece of libcurl's).
"""
from __future__ import annotations

import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import pycurl

from storage.client import StorageError

SignedGet = Callable[[str, str, dict[str, str]], tuple[str, dict[str, str]]]  # (bucket, key, headers) -> (URL, headers)
RESIGN_AFTER = 60.0     # seconds a signature is reused (S3 accepts up to 15 minutes of clock skew)
SIGNATURES_KEPT = 1024  # objects whose signature is kept (a corpus has one object per shard)


class _Body:
    """libcurl's write callback: keeps at most ``limit`` bytes, then stops the transfer."""

    def __init__(self, limit: int):
        self.data, self.limit, self.overflow = bytearray(), limit, False

    def write(self, piece: bytes) -> int:
        if len(self.data) + len(piece) > self.limit:
            self.overflow = True
            return 0  # anything but len(piece) aborts the transfer (CURLE_WRITE_ERROR)
        self.data += piece
        return len(piece)


class RangedGets:
    """``get(bucket, key, start, length)``: one ranged GET, never reading more than ``length`` bytes."""

    def __init__(self, signed_get: SignedGet, timeout: float, resign_after: float = RESIGN_AFTER,
                 clock: Callable[[], float] = time.monotonic):
        self._signed_get, self.timeout, self.resign_after, self._clock = signed_get, timeout, resign_after, clock
        self._lock = threading.Lock()
        self._signatures: OrderedDict[tuple[str, str], tuple[float, str, list[str]]] = OrderedDict()
        self._local = threading.local()
        self.signed = self.requests = 0

    def get(self, bucket: str, key: str, start: int, length: int) -> bytes:
        if start < 0 or length <= 0:
            raise ValueError("a range needs start >= 0 and length > 0")
        what = f"GET {bucket}/{key} bytes {start}-{start + length - 1}"
        url, headers = self._signature(bucket, key)
        curl, body = self._curl(), _Body(length)
        curl.setopt(pycurl.URL, url)
        curl.setopt(pycurl.HTTPHEADER, [*headers, f"Range: bytes={start}-{start + length - 1}"])
        curl.setopt(pycurl.WRITEFUNCTION, body.write)
        try:
            curl.perform()
        except pycurl.error as e:
            status = int(curl.getinfo(pycurl.RESPONSE_CODE))
            if body.overflow:  # stopped by the callback: the status says whether it was ours to read
                raise _status_error(status, what) if status != 206 else \
                    StorageError("too_large", f"{what}: more than the {length} bytes asked for") from None
            raise _curl_error(e, what) from None
        finally:
            with self._lock:
                self.requests += 1
        status = int(curl.getinfo(pycurl.RESPONSE_CODE))
        if status != 206:
            raise _status_error(status, what)
        return bytes(body.data)

    def _signature(self, bucket: str, key: str) -> tuple[str, list[str]]:
        """The URL and headers of a signed GET of the object, signed again once ``resign_after`` old."""
        now = self._clock()
        with self._lock:  # signing held under it too (~3 ms): threads that start together sign once, not each
            kept = self._signatures.get((bucket, key))
            if kept is not None and now - kept[0] < self.resign_after:
                self._signatures.move_to_end((bucket, key))
                return kept[1], kept[2]
            url, headers = self._signed_get(bucket, key, {})
            lines = [f"{name}: {value}" for name, value in headers.items()]
            self.signed += 1
            self._signatures[(bucket, key)] = (now, url, lines)
            self._signatures.move_to_end((bucket, key))
            while len(self._signatures) > SIGNATURES_KEPT:
                self._signatures.popitem(last=False)
        return url, lines

    def _curl(self) -> pycurl.Curl:
        """This thread's handle (its connection is kept alive between requests)."""
        curl: pycurl.Curl | None = getattr(self._local, "curl", None)
        if curl is None:
            curl = self._local.curl = pycurl.Curl()
            curl.setopt(pycurl.NOSIGNAL, 1)                  # threads: no SIGALRM for timeouts
            curl.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
            curl.setopt(pycurl.FOLLOWLOCATION, 0)
            curl.setopt(pycurl.PROXY, "")                    # as botocore's endpoint: no proxy from the environment
            curl.setopt(pycurl.CONNECTTIMEOUT_MS, int(self.timeout * 1000))
            curl.setopt(pycurl.LOW_SPEED_LIMIT, 1)           # a read timeout: no byte for `timeout` seconds
            curl.setopt(pycurl.LOW_SPEED_TIME, max(1, round(self.timeout)))
            paths = ssl.get_default_verify_paths()           # the CAs Python's ssl (and urllib3) trust
            if paths.cafile:
                curl.setopt(pycurl.CAINFO, paths.cafile)
            if paths.capath:
                curl.setopt(pycurl.CAPATH, paths.capath)
        return curl


def _curl_error(e: pycurl.error, what: str) -> StorageError:
    code, message = (e.args + (0, ""))[:2]
    if code == pycurl.E_OPERATION_TIMEDOUT:
        return StorageError("timeout", f"{what}: timed out ({message})")
    return StorageError("unavailable", f"{what}: curl error {code}: {message}", retryable=True)


def _status_error(status: int, what: str) -> StorageError:
    if status == 404:
        return StorageError("missing", f"{what}: not found (404)", status)
    if status in (401, 403):
        return StorageError("denied", f"{what}: access denied ({status})", status)
    if status == 200:  # the whole object instead of the range: never read it
        return StorageError("unavailable", f"{what}: the server ignored the Range header (200)", status)
    return StorageError("unavailable", f"{what}: HTTP {status}", status, retryable=status >= 500 or status == 429)
