"""S3 access for the whole code base: the one place (with :mod:`storage.server`) that imports boto3.

Works against any S3-compatible endpoint (AWS, R2, MinIO, the embedded moto
server): path-style addressing, connect/read timeouts, retries with
exponential backoff on throttling, 5xx and dropped connections (botocore's
"standard" or "adaptive" modes), multipart upload above a size threshold, and
byte counters.  Every botocore failure is translated into a
:class:`StorageError` with a coarse ``kind`` so callers never need botocore.
"""
from __future__ import annotations

import io
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

import boto3
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore import UNSIGNED
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config as BotoConfig
from botocore.credentials import Credentials
from botocore.exceptions import BotoCoreError, ClientError, ConnectTimeoutError, ReadTimeoutError

if TYPE_CHECKING:
    from dso.config.schema import StorageConfig

MiB = 1024 * 1024
READ_CHUNK = 256 * 1024

_MISSING_CODES = {"NoSuchKey", "NoSuchBucket", "NotFound", "404"}
_DENIED_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "403", "401",
                 "AllAccessDisabled", "ExpiredToken"}


class StorageError(Exception):
    """An S3 call failed.  ``kind``: missing | denied | unavailable | timeout | too_large | refused (an
    endpoint outside the policy of :mod:`storage.endpoints`)."""

    def __init__(self, kind: str, message: str, status: int | None = None, retryable: bool = False):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.status = status  # HTTP status when the server answered
        self.retryable = retryable  # worth another attempt (5xx, 429, dropped connection)


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    last_modified: float  # unix seconds, the server's clock (1 s resolution on HEAD)
    etag: str = ""


def translate(exc: BaseException, what: str) -> StorageError:
    """Map a botocore/urllib3 failure onto a StorageError kind."""
    if isinstance(exc, StorageError):
        return exc
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {}) or {}
        code = str(err.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in _MISSING_CODES or status == 404:
            return StorageError("missing", f"{what}: not found ({code or status})", status)
        if code in _DENIED_CODES or status in (401, 403):
            return StorageError("denied", f"{what}: access denied ({code or status})", status)
        return StorageError("unavailable", f"{what}: {code or status} {err.get('Message', '')}".strip(), status)
    if isinstance(exc, (ReadTimeoutError, ConnectTimeoutError, TimeoutError)):
        return StorageError("timeout", f"{what}: {type(exc).__name__}")
    if isinstance(exc, BotoCoreError):
        return StorageError("unavailable", f"{what}: {exc}")
    # urllib3 / socket errors while streaming a body
    return StorageError("unavailable", f"{what}: {type(exc).__name__}: {exc}")


# One boto3 session for every client: sessions are not thread-safe, clients are;
# creating clients from one session also reuses the loaded service models.
_SESSION_LOCK = threading.Lock()
_SESSION: boto3.session.Session | None = None


def _new_client(endpoint: str | None, region: str, key: str, secret: str, config: BotoConfig) -> Any:  # boto3
    global _SESSION
    with _SESSION_LOCK:
        if _SESSION is None:
            _SESSION = boto3.session.Session()
        return _SESSION.client("s3", endpoint_url=endpoint or None, region_name=region,
                               aws_access_key_id=key or None, aws_secret_access_key=secret or None,
                               config=config)


class ObjectReader(Protocol):
    """What reads objects from a bucket: an :class:`S3Client` (our own bucket) or a
    :class:`storage.peer_client.PeerClient` (another node's, read-only and deadline-bounded)."""

    def head(self, bucket: str, key: str, deadline: float | None = None) -> ObjectInfo: ...

    def get(self, bucket: str, key: str, max_bytes: int | None = None, deadline: float | None = None) -> bytes: ...

    def get_with_info(self, bucket: str, key: str, max_bytes: int | None = None,
                      deadline: float | None = None) -> tuple[bytes, ObjectInfo]: ...

    def list(self, bucket: str, prefix: str = "", limit: int = 100_000) -> list[ObjectInfo]: ...


class S3Client:
    """Thread-safe S3 client for one endpoint and one key pair.

    Credentials come from the arguments, else (unless ``use_environment`` is off) from
    ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (region: ``AWS_REGION``; an empty endpoint lets
    botocore use ``AWS_ENDPOINT_URL_S3`` or AWS itself); with neither, requests are sent unsigned
    (anonymous reads of public buckets).  The shared-credentials file and
    instance metadata are deliberately not consulted: a peer's identity must be
    explicit."""

    def __init__(self, endpoint: str | None, region: str = "us-east-1", access_key_id: str = "",
                 secret_access_key: str = "", timeout: float = 10.0, max_attempts: int = 4,
                 retry_mode: str = "standard", max_pool_connections: int = 16,
                 multipart_threshold: int = 64 * MiB, multipart_chunksize: int = 16 * MiB,
                 use_environment: bool = True):
        env = os.environ if use_environment else {}
        key = access_key_id or env.get("AWS_ACCESS_KEY_ID", "")
        secret = secret_access_key or env.get("AWS_SECRET_ACCESS_KEY", "")
        if bool(key) != bool(secret):
            raise ValueError("S3 credentials need both an access key id and a secret")
        if timeout <= 0 or max_attempts < 1:
            raise ValueError("timeout must be > 0 and max_attempts >= 1")
        if retry_mode not in ("standard", "adaptive", "legacy"):
            raise ValueError(f"retry_mode must be standard, adaptive or legacy, got {retry_mode!r}")
        region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        self.endpoint, self.region, self.access_key_id, self.timeout = endpoint, region, key, timeout
        config = BotoConfig(
            connect_timeout=timeout, read_timeout=timeout,
            retries={"max_attempts": max_attempts, "mode": retry_mode},
            s3={"addressing_style": "path"},
            max_pool_connections=max_pool_connections,
            # default CRC checksums are not understood by every S3-compatible server
            request_checksum_calculation="when_required", response_checksum_validation="when_required",
            **({} if key else {"signature_version": UNSIGNED}))
        self._client = _new_client(endpoint, region, key, secret, config)
        self._credentials = Credentials(key, secret) if key else None
        self.multipart_threshold = multipart_threshold
        self._transfer = TransferConfig(multipart_threshold=multipart_threshold,
                                        multipart_chunksize=multipart_chunksize, max_concurrency=4)
        self._lock = threading.Lock()
        self.bytes_up = 0
        self.bytes_down = 0

    @classmethod
    def from_config(cls, storage_cfg: StorageConfig, read_only: bool = False) -> S3Client:
        """Build from a :class:`dso.config.schema.StorageConfig` (write keys, or the published read keys)."""
        key = storage_cfg.read_access_key_id if read_only else storage_cfg.access_key_id
        secret = storage_cfg.read_secret_access_key if read_only else storage_cfg.secret_access_key
        if read_only and not (key and secret):
            # never fall back to the environment here: that would be the write key
            raise ValueError("storage.read_access_key_id and storage.read_secret_access_key are not set")
        return cls(storage_cfg.endpoint, storage_cfg.region, key, secret, storage_cfg.timeout_seconds)

    def _count(self, up: int = 0, down: int = 0) -> None:
        with self._lock:
            self.bytes_up += up
            self.bytes_down += down

    # ------------------------------------------------------------- writes
    def put(self, bucket: str, key: str, data: bytes, content_type: str = "application/octet-stream") -> None:
        what = f"PUT {bucket}/{key}"
        try:
            if len(data) >= self.multipart_threshold:
                self._client.upload_fileobj(io.BytesIO(data), bucket, key, ExtraArgs={"ContentType": content_type},
                                            Config=self._transfer)
            else:
                self._client.put_object(Bucket=bucket, Key=key, Body=data, ContentType=content_type)
        except Exception as e:  # noqa: BLE001 — translated, never leaks botocore types
            # boto3 wraps the ClientError of a failed multipart upload in S3UploadFailedError
            raise translate(e.__context__ if isinstance(e, S3UploadFailedError) and e.__context__ else e,
                            what) from None
        self._count(up=len(data))

    def put_file(self, bucket: str, key: str, path: str | os.PathLike[str],
                 content_type: str = "application/octet-stream") -> int:
        """Upload a file from disk (multipart above the threshold, read in parts: the file is never held in
        memory whole); returns its size."""
        size = os.path.getsize(path)
        try:
            self._client.upload_file(os.fspath(path), bucket, key, ExtraArgs={"ContentType": content_type},
                                     Config=self._transfer)
        except Exception as e:  # noqa: BLE001
            raise translate(e.__context__ if isinstance(e, S3UploadFailedError) and e.__context__ else e,
                            f"PUT {bucket}/{key}") from None
        self._count(up=size)
        return size

    def delete(self, bucket: str, keys: list[str]) -> int:
        """Delete keys (batches of 1000); returns how many the server reported deleted."""
        deleted = 0
        for start in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[start:start + 1000]]
            try:
                resp = self._client.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": False})
            except Exception as e:  # noqa: BLE001
                raise translate(e, f"DELETE {bucket}") from None
            deleted += len(resp.get("Deleted", []))
            errors = resp.get("Errors", [])
            if errors:  # bulk delete reports per-key failures inside a 200 response
                code = str(errors[0].get("Code", ""))
                denied = code in _DENIED_CODES
                raise StorageError("denied" if denied else "unavailable",
                                   f"DELETE {bucket}: {len(errors)} keys not deleted ({code})", 403 if denied else None)
        return deleted

    def ensure_bucket(self, bucket: str) -> bool:
        """Create the bucket unless it exists and is ours; returns True when it was created."""
        try:
            self._client.head_bucket(Bucket=bucket)
            return False
        except Exception as e:  # noqa: BLE001
            err = translate(e, f"HEAD bucket {bucket}")
            if err.kind != "missing":
                raise err from None
        try:
            if self.region and self.region not in ("us-east-1", "auto"):
                self._client.create_bucket(Bucket=bucket, CreateBucketConfiguration={
                    "LocationConstraint": self.region})
            else:
                self._client.create_bucket(Bucket=bucket)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                raise translate(e, f"CREATE bucket {bucket}") from None
            return False
        except Exception as e:  # noqa: BLE001
            raise translate(e, f"CREATE bucket {bucket}") from None
        return True

    # -------------------------------------------------------------- reads
    def head(self, bucket: str, key: str, deadline: float | None = None) -> ObjectInfo:
        """``deadline`` is accepted for symmetry with :class:`storage.peer_client.PeerClient` and not
        enforced here (our own bucket: botocore's per-request timeouts apply)."""
        try:
            resp = self._client.head_object(Bucket=bucket, Key=key)
        except Exception as e:  # noqa: BLE001
            raise translate(e, f"HEAD {bucket}/{key}") from None
        return _info(key, resp)

    def get(self, bucket: str, key: str, max_bytes: int | None = None, deadline: float | None = None) -> bytes:
        return self.get_with_info(bucket, key, max_bytes, deadline)[0]

    def get_with_info(self, bucket: str, key: str, max_bytes: int | None = None,
                      deadline: float | None = None) -> tuple[bytes, ObjectInfo]:
        """Download an object, never reading more than ``max_bytes`` (whatever the server
        announced) nor past ``deadline`` (``time.monotonic()`` value)."""
        what = f"GET {bucket}/{key}"
        try:
            resp = self._client.get_object(Bucket=bucket, Key=key)
        except Exception as e:  # noqa: BLE001
            raise translate(e, what) from None
        data = self._read_body(resp, what, max_bytes, deadline)
        return data, _info(key, resp, size=len(data))

    def signed_get(self, bucket: str, key: str, headers: dict[str, str]) -> tuple[str, dict[str, str]]:
        """The URL and headers of a GET of ``key`` with ``headers`` (e.g. a Range), signed with this client's
        keys (unsigned without keys): :mod:`storage.ranged` sends it without botocore's per-request cost."""
        base = (self.endpoint or f"https://s3.{self.region}.amazonaws.com").rstrip("/")
        request = AWSRequest(method="GET", url=f"{base}/{bucket}/{quote(key, safe='/~')}", headers=headers)
        if self._credentials is not None:
            S3SigV4Auth(self._credentials, "s3", self.region).add_auth(request)
        return request.url, dict(request.headers.items())

    def _read_body(self, resp: dict[str, Any], what: str, max_bytes: int | None, deadline: float | None) -> bytes:
        body = resp["Body"]
        try:
            announced = resp.get("ContentLength")
            if max_bytes is not None and announced is not None and announced > max_bytes:
                raise StorageError("too_large", f"{what}: {announced} bytes announced, cap {max_bytes}")
            parts, total = [], 0
            while True:
                if deadline is not None and time.monotonic() > deadline:
                    raise StorageError("timeout", f"{what}: deadline passed after {total} bytes")
                chunk = body.read(READ_CHUNK)
                if not chunk:
                    break
                total += len(chunk)
                self._count(down=len(chunk))
                if max_bytes is not None and total > max_bytes:
                    raise StorageError("too_large", f"{what}: body exceeds cap {max_bytes}")
                parts.append(chunk)
        except Exception as e:  # noqa: BLE001
            raise translate(e, what) from None
        finally:
            body.close()
        return b"".join(parts)

    def list(self, bucket: str, prefix: str = "", limit: int = 100_000) -> list[ObjectInfo]:
        out: list[ObjectInfo] = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for page in pages:
                for obj in page.get("Contents", []):
                    out.append(ObjectInfo(obj["Key"], int(obj.get("Size", 0)), obj["LastModified"].timestamp(),
                                          str(obj.get("ETag", "")).strip('"')))
                    if len(out) >= limit:
                        return out
        except Exception as e:  # noqa: BLE001
            raise translate(e, f"LIST {bucket}/{prefix}") from None
        return out


def _info(key: str, resp: dict[str, Any], size: int | None = None) -> ObjectInfo:
    modified = resp.get("LastModified")
    return ObjectInfo(key, int(resp.get("ContentLength", 0) if size is None else size),
                      modified.timestamp() if modified is not None else float("nan"),
                      str(resp.get("ETag", "")).strip('"'))
