"""The chain commitment that tells everyone where a peer's objects are and how to read them.

Format (ASCII, at most :data:`MAX_LENGTH` characters, fields separated by ``|``)::

    dso1|<endpoint URL>|<region>|<bucket>|<read key id>|<read secret>[|<role>]

The leading tag carries the format version so the layout can change later
without ambiguity.  The optional seventh field is a role from
:data:`dso.chain.roles.ROLES` (``validator``: a validator running this
protocol, which the leader is chosen among); without it, as in every
commitment written before roles existed, the peer is a miner.  Any other
seventh field is rejected.  ``|`` and whitespace cannot occur in any field.  Parsing
another peer's commitment never raises: anything malformed is a
``Rejection(BAD_COMMITMENT)`` naming the field.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from dso.chain.roles import ROLES, with_role
from dso.protocol.rejections import Reason, Rejection

TAG = "dso1"
SEPARATOR = "|"
MAX_LENGTH = 384  # what the real chain holds (3 raw fields of 128 bytes); LocalChain enforces the same

_REGION = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
_KEY_ID = re.compile(r"[A-Za-z0-9._~+/=-]{1,128}")
_SECRET = re.compile(r"[\x21-\x7b\x7d\x7e]{1,256}")  # printable ASCII without space and '|'
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


@dataclass(frozen=True)
class BucketInfo:
    """Where a peer's objects live and the read-only key pair to read them."""

    endpoint: str
    region: str
    bucket: str
    access_key_id: str
    secret_access_key: str
    role: str = ""  # "" = miner; else one of dso.chain.roles.ROLES

    def __repr__(self) -> str:  # keep secrets out of logs
        return f"BucketInfo(endpoint={self.endpoint!r}, region={self.region!r}, bucket={self.bucket!r}, " \
               f"access_key_id={self.access_key_id!r}, secret_access_key='***', role={self.role!r})"


def bucket_name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid S3 bucket name (general-purpose bucket rules), or None."""
    if not isinstance(name, str) or not _BUCKET.fullmatch(name):
        return "3-63 characters of a-z, 0-9, '.', '-', starting and ending with a letter or digit"
    if ".." in name or ".-" in name or "-." in name:
        return "no adjacent '.'/'-' pairs"
    try:
        ipaddress.IPv4Address(name)
        return "must not look like an IP address"
    except ValueError:
        pass
    if name.startswith(("xn--", "sthree-")) or name.endswith(("-s3alias", "--ol-s3")):
        return "reserved prefix or suffix"
    return None


def endpoint_problem(url: str) -> str | None:
    """Why ``url`` is not an acceptable S3 endpoint (http(s)://host[:port][/]), or None."""
    if not isinstance(url, str) or not url or any(c.isspace() or c == SEPARATOR for c in url):
        return "empty or contains whitespace or '|'"
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError on a bad port
    except ValueError as e:
        return f"unparsable URL ({e})"
    if parts.scheme not in ("http", "https"):
        return "scheme must be http or https"
    if not parts.hostname or "@" in parts.netloc:
        return "needs a host and no user info"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "must not have a path, query or fragment"
    if port == 0:
        return "port 0"
    return None


def _problem(info: BucketInfo) -> str | None:
    checks = (
        ("endpoint", endpoint_problem(info.endpoint)),
        ("region", None if isinstance(info.region, str) and _REGION.fullmatch(info.region)
         else "1-32 characters of a-z, 0-9, '-'"),
        ("bucket", bucket_name_problem(info.bucket)),
        ("read key id", None if isinstance(info.access_key_id, str) and _KEY_ID.fullmatch(info.access_key_id)
         else "1-128 characters of A-Z a-z 0-9 . _ ~ + / = -"),
        ("read secret", None if isinstance(info.secret_access_key, str)
         and _SECRET.fullmatch(info.secret_access_key) else "1-256 printable characters, no space or '|'"),
    )
    for field, problem in checks:
        if problem:
            return f"{field}: {problem}"
    if info.role and info.role not in ROLES:
        return f"role: unknown role {info.role[:16]!r} (known: {', '.join(ROLES)})"
    return None


def format_commitment(info: BucketInfo) -> str:
    """The commitment string for our own bucket; raises ValueError if it would not parse back."""
    problem = _problem(info)
    if problem:
        raise ValueError(f"cannot publish this bucket: {problem}")
    text = SEPARATOR.join((TAG, info.endpoint, info.region, info.bucket, info.access_key_id,
                           info.secret_access_key))
    if info.role:
        text = with_role(text, info.role)
    if len(text) > MAX_LENGTH:
        raise ValueError(f"commitment is {len(text)} characters, limit {MAX_LENGTH}")
    return text


def parse_commitment(text: object) -> BucketInfo | Rejection:
    """Another peer's commitment → BucketInfo, or Rejection(BAD_COMMITMENT) saying what is wrong."""
    def bad(detail: str) -> Rejection:
        return Rejection(Reason.BAD_COMMITMENT, detail)

    if not isinstance(text, str):
        return bad(f"expected a string, got {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        return bad(f"{len(text)} characters, limit {MAX_LENGTH}")
    if not text.isascii() or not text.isprintable():
        return bad("non-ASCII or non-printable characters")
    fields = text.split(SEPARATOR)
    if fields[0] != TAG:
        return bad(f"unknown format tag {fields[0][:16]!r} (expected {TAG!r})")
    if len(fields) not in (6, 7):
        return bad(f"{len(fields)} fields, expected 6 (or 7 with a role)")
    if len(fields) == 7 and fields[6] not in ROLES:
        return bad(f"role: unknown role {fields[6][:16]!r} (known: {', '.join(ROLES)})")
    info = BucketInfo(*fields[1:])
    problem = _problem(info)
    return bad(problem) if problem else info
