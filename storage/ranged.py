"""Ranged GETs at half of botocore's CPU: requests signed by :meth:`storage.client.S3Client.signed_get`
(botocore's SigV4 signer alone), sent through a plain urllib3 pool.

A miner reading its corpus from a bucket makes about one 64 KiB ranged GET per sequence (500 a window).
Through a botocore client each costs about 3 ms of CPU on a loaded 2-core machine (events, endpoint
resolution, parsing); signed and sent this way, about half (docs/decisions/0500-chunked-remote-shards.md).
That CPU is taken from training when the machine has no idle core.  (Presigning one URL per object would
be cheaper still, but the embedded moto server refuses presigned URLs when its IAM checks are on.)

Failures become :class:`storage.client.StorageError` with the same kinds botocore's do.
"""
from __future__ import annotations

from collections.abc import Callable

import urllib3

from storage.client import READ_CHUNK, StorageError

SignedGet = Callable[[str, str, dict[str, str]], tuple[str, dict[str, str]]]  # (bucket, key, headers) -> (URL, headers)


class RangedGets:
    """``get(bucket, key, start, length)``: one ranged GET, never reading more than ``length`` bytes."""

    def __init__(self, signed_get: SignedGet, timeout: float, pool_size: int = 16):
        self._signed_get = signed_get
        self._pool = urllib3.PoolManager(maxsize=pool_size, block=False, retries=False,
                                         timeout=urllib3.Timeout(connect=timeout, read=timeout))

    def get(self, bucket: str, key: str, start: int, length: int) -> bytes:
        if start < 0 or length <= 0:
            raise ValueError("a range needs start >= 0 and length > 0")
        what = f"GET {bucket}/{key} bytes {start}-{start + length - 1}"
        try:
            url, headers = self._signed_get(bucket, key, {"Range": f"bytes={start}-{start + length - 1}"})
            resp = self._pool.request("GET", url, headers=headers, preload_content=False)
        except urllib3.exceptions.NewConnectionError as e:  # (a subclass of the connect timeout)
            raise StorageError("unavailable", f"{what}: {type(e).__name__}: {e}", retryable=True) from None
        except urllib3.exceptions.TimeoutError as e:
            raise StorageError("timeout", f"{what}: {type(e).__name__}") from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise StorageError("unavailable", f"{what}: {type(e).__name__}: {e}", retryable=True) from None
        try:
            if resp.status != 206:
                raise _status_error(resp.status, what)
            data = _read_at_most(resp, length, what)
        except urllib3.exceptions.TimeoutError as e:
            resp.close()
            raise StorageError("timeout", f"{what}: {type(e).__name__} while reading") from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            resp.close()
            raise StorageError("unavailable", f"{what}: {type(e).__name__}: {e}", retryable=True) from None
        except StorageError:
            resp.close()  # an unread body: the connection is not reused
            raise
        resp.release_conn()
        return data


def _status_error(status: int, what: str) -> StorageError:
    if status == 404:
        return StorageError("missing", f"{what}: not found (404)", status)
    if status in (401, 403):
        return StorageError("denied", f"{what}: access denied ({status})", status)
    if status == 200:  # the whole object instead of the range: never read it
        return StorageError("unavailable", f"{what}: the server ignored the Range header (200)", status)
    return StorageError("unavailable", f"{what}: HTTP {status}", status, retryable=status >= 500 or status == 429)


def _read_at_most(resp: urllib3.BaseHTTPResponse, length: int, what: str) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        chunk = resp.read(min(READ_CHUNK, length + 1 - total))
        if not chunk:
            return b"".join(parts)
        total += len(chunk)
        if total > length:
            raise StorageError("too_large", f"{what}: more than the {length} bytes asked for")
        parts.append(chunk)
