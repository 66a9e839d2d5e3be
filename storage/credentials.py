"""Key material of the storage layer: the admin key of a server we run, each peer's bucket keys,
and provisioning through the AWS IAM API (moto, AWS).

A peer owns one bucket and two key pairs: a **write** key it keeps private
(``s3:*`` on its bucket only) and a **read** key it publishes on chain
(``s3:GetObject`` + ``s3:ListBucket`` on that bucket).  How the keys are made
depends on the provider: the IAM API here (moto, AWS), an identity file for
SeaweedFS (:mod:`storage.seaweedfs`), the provider's console or CLI for R2,
MinIO, B2 or GCS (docs/deployment.md).  Whatever made them, a node only ever
sees a :class:`PeerCredentials`.
"""
from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config as BotoConfig

from storage.client import S3Client
from storage.commitment import BucketInfo, format_commitment

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

ADMIN_USER = "dso-admin"
BUCKET_PREFIX = "dso-"
REGION = "us-east-1"
_PEER_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?")


def _write_private(path: str | Path, data: dict[str, Any]) -> None:
    """Write JSON readable by the owner only, atomically (readers never see half a file)."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)


def _load_fields(cls: type[DataclassInstance], path: str | Path) -> dict[str, str]:
    """The dataclass fields of ``cls`` from a JSON file; ValueError naming what is missing or wrong."""
    path = Path(path).expanduser()
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ValueError(f"{path} is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    missing = [f.name for f in fields(cls) if f.name not in data]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}")
    bad = [f.name for f in fields(cls) if not isinstance(data[f.name], str)]
    if bad:
        raise ValueError(f"{path}: {', '.join(bad)} must be strings")
    return {f.name: data[f.name] for f in fields(cls)}


@dataclass(frozen=True)
class AdminCredentials:
    endpoint: str
    region: str
    access_key_id: str
    secret_access_key: str

    @classmethod
    def load(cls, path: str | Path) -> AdminCredentials:
        return cls(**_load_fields(cls, path))

    def save(self, path: str | Path) -> None:
        _write_private(path, asdict(self))

    def client(self, **kw: Any) -> S3Client:
        return S3Client(self.endpoint, self.region, self.access_key_id, self.secret_access_key, **kw)

    def __repr__(self) -> str:
        return f"AdminCredentials(endpoint={self.endpoint!r}, access_key_id={self.access_key_id!r})"


@dataclass(frozen=True)
class PeerCredentials:
    name: str
    endpoint: str
    region: str
    bucket: str
    write_key_id: str
    write_secret: str
    read_key_id: str
    read_secret: str

    @classmethod
    def load(cls, path: str | Path) -> PeerCredentials:
        """From the JSON ``provision`` prints (extra keys such as ``commitment`` are ignored)."""
        return cls(**_load_fields(cls, path))

    def save(self, path: str | Path) -> None:
        _write_private(path, {**asdict(self), "commitment": self.commitment()})

    def read_info(self) -> BucketInfo:
        return BucketInfo(self.endpoint, self.region, self.bucket, self.read_key_id, self.read_secret)

    def commitment(self) -> str:
        return format_commitment(self.read_info())

    def write_client(self, **kw: Any) -> S3Client:
        return S3Client(self.endpoint, self.region, self.write_key_id, self.write_secret, **kw)

    def read_client(self, **kw: Any) -> S3Client:
        return S3Client(self.endpoint, self.region, self.read_key_id, self.read_secret, **kw)

    def __repr__(self) -> str:
        return f"PeerCredentials(name={self.name!r}, endpoint={self.endpoint!r}, bucket={self.bucket!r})"


def check_peer_name(name: object) -> str:
    """``name`` if it makes a valid bucket ``dso-<name>`` and user names, else ValueError."""
    if not isinstance(name, str) or not _PEER_NAME.fullmatch(name) or "--" in name:
        raise ValueError(f"peer name {name!r}: 1-40 characters of a-z, 0-9 and single '-', not at the ends")
    return name


# ------------------------------------------------------------------ IAM path
def _policy(actions: list[str], bucket: str) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Action": actions,
        "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}]})


@functools.lru_cache(maxsize=8)
def iam_client(endpoint: str, key: str, secret: str, attempts: int = 3) -> Any:  # boto3 client: untyped
    """IAM client (cached: building one loads the service model, ~0.1 s)."""
    return boto3.session.Session().client(
        "iam", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=key, aws_secret_access_key=secret,
        config=BotoConfig(connect_timeout=10, read_timeout=30, retries={"max_attempts": attempts,
                                                                        "mode": "standard"}))


def _user_with_fresh_key(iam: Any, user: str, policy_name: str, policy: str) -> tuple[str, str]:
    """Create (or reuse) an IAM user, set its only policy, and issue a fresh key (old keys revoked)."""
    try:
        iam.create_user(UserName=user)
    except iam.exceptions.EntityAlreadyExistsException:
        for key in iam.list_access_keys(UserName=user)["AccessKeyMetadata"]:
            iam.delete_access_key(UserName=user, AccessKeyId=key["AccessKeyId"])
    iam.put_user_policy(UserName=user, PolicyName=policy_name, PolicyDocument=policy)
    key = iam.create_access_key(UserName=user)["AccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]


def provision_peer(admin: AdminCredentials, name: str, create_bucket: bool = True) -> PeerCredentials:
    """Through the IAM API: bucket ``dso-<name>`` + write and read-only users.
    Re-provisioning a name revokes its old keys.  Raises botocore errors where IAM is refused
    (the ``provision`` command turns them into one line saying what to do)."""
    bucket = BUCKET_PREFIX + check_peer_name(name)
    iam = iam_client(admin.endpoint, admin.access_key_id, admin.secret_access_key)
    write = _user_with_fresh_key(iam, f"dso-{name}-write", "bucket-owner", _policy(["s3:*"], bucket))
    read = _user_with_fresh_key(iam, f"dso-{name}-read", "bucket-reader",
                                _policy(["s3:GetObject", "s3:ListBucket"], bucket))
    creds = PeerCredentials(name, admin.endpoint, admin.region, bucket, *write, *read)
    if create_bucket:
        creds.write_client().ensure_bucket(bucket)
    return creds
