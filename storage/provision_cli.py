"""``python -m storage.server provision|check``: make a peer's keys, or check keys made elsewhere.

    provision NAME [--admin-file F]                       IAM API (moto, AWS)
    provision NAME --seaweedfs-config FILE --endpoint URL  SeaweedFS identity file
    check CREDS.json                                       any provider (R2, MinIO, B2, ...)

Every refusal ends in one line on stderr saying what to do (exit 2), never a
traceback: an endpoint without an IAM API is the normal case outside moto and
AWS, and the operator then creates keys by the provider's own means.
"""
from __future__ import annotations

import argparse
import json
import secrets
import sys
from collections.abc import Callable
from dataclasses import asdict

from botocore.exceptions import BotoCoreError, ClientError

from dso.protocol.rejections import Rejection
from storage.client import StorageError
from storage.commitment import endpoint_problem, parse_commitment
from storage.credentials import AdminCredentials, PeerCredentials, provision_peer

PROG = "python -m storage.server"
DOCS = "docs/deployment.md"


class CliError(Exception):
    """A refusal to report as one line."""


def _iam_refusal(endpoint: str, name: str, exc: Exception) -> CliError:
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {}) or {}
        why = f"{err.get('Code') or exc.response.get('ResponseMetadata', {}).get('HTTPStatusCode')}: " \
              f"{err.get('Message') or ''}".strip().rstrip(":")
    else:
        why = f"{type(exc).__name__}: {exc}"
    return CliError(f"{endpoint} refused the IAM API ({why}); this provider manages keys itself: create a "
                    f"write key and a read-only key for bucket dso-{name} with its own tools ({DOCS}), or for "
                    f"SeaweedFS run `{PROG} provision {name} --seaweedfs-config FILE --endpoint {endpoint}`")


def provision(args: argparse.Namespace) -> PeerCredentials:
    if args.seaweedfs_config:
        return _provision_seaweedfs(args)
    if args.public_read:
        raise CliError(f"--public-read works with --seaweedfs-config; elsewhere make the bucket public with the "
                       f"provider's own means (a bucket policy, R2's public access; {DOCS})")
    try:
        admin = AdminCredentials.load(args.admin_file)
    except ValueError as e:
        raise CliError(f"{e}: pass --admin-file (written by `{PROG}` at start-up) or, without IAM, "
                       f"--seaweedfs-config (see {DOCS})") from None
    try:
        return provision_peer(admin, args.name)
    except (ClientError, BotoCoreError) as e:
        raise _iam_refusal(admin.endpoint, args.name, e) from None
    except StorageError as e:
        raise CliError(f"keys were made but bucket dso-{args.name} could not be created: {e}") from None


def _provision_seaweedfs(args: argparse.Namespace) -> PeerCredentials:
    from storage.seaweedfs import IdentityFile

    if not args.endpoint or endpoint_problem(args.endpoint):
        raise CliError(f"--endpoint: the SeaweedFS S3 gateway's URL is needed to publish "
                       f"({endpoint_problem(args.endpoint or '')})")
    identities = IdentityFile(args.seaweedfs_config)
    creds = identities.add_peer(args.name, args.endpoint.rstrip("/"), args.region)
    if args.public_read:
        identities.add_public_reader(creds.bucket)
        print(f"{PROG}: unsigned requests may read and list {creds.bucket} (identity 'anonymous')", file=sys.stderr)
    print(f"{PROG}: identities dso-{args.name}-write/-read added to {args.seaweedfs_config}; reload SeaweedFS "
          f"(`kill -HUP <weed pid>`) and create bucket {creds.bucket} with an admin key "
          f"(`aws s3 mb s3://{creds.bucket} --endpoint-url {creds.endpoint}`)", file=sys.stderr)
    return creds


def check(creds: PeerCredentials) -> list[str]:
    """Problems with a peer's keys (empty = usable): the write key writes, reads and deletes its bucket;
    the read key reads and lists it but can neither write nor delete; the commitment parses."""
    problems: list[str] = []
    if isinstance(parsed := parse_commitment(creds.commitment()), Rejection):
        problems.append(f"commitment does not parse: {parsed}")
    w, r = creds.write_client(max_attempts=1), creds.read_client(max_attempts=1)
    key = f"dso-keycheck/{secrets.token_hex(6)}"

    def expect(what: str, action: Callable[[], object], denied: bool = False) -> None:
        try:
            action()
        except StorageError as e:
            if not (denied and e.kind == "denied"):
                problems.append(f"{what}: {e}")
            return
        if denied:
            problems.append(f"{what}: allowed, but must be refused (a published read key must not write)")

    expect("write key PUT", lambda: w.put(creds.bucket, key, b"dso key check"))
    def read_back() -> None:
        if r.get(creds.bucket, key) != b"dso key check":
            problems.append("read key GET: returned other bytes")

    expect("read key GET", read_back)
    expect("read key LIST", lambda: r.list(creds.bucket, prefix="dso-keycheck/"))
    expect("read key PUT", lambda: r.put(creds.bucket, key + "-r", b"x"), denied=True)
    expect("read key DELETE", lambda: r.delete(creds.bucket, [key]), denied=True)
    expect("write key DELETE", lambda: w.delete(creds.bucket, [key]))
    return problems


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    pp = sub.add_parser("provision", help="bucket dso-NAME with a write and a read-only key pair")
    pp.add_argument("name")
    pp.add_argument("--admin-file", default="~/.dso/localnet/s3-admin.json", help="admin key (IAM path)")
    pp.add_argument("--seaweedfs-config", default="", help="SeaweedFS -s3.config file to add identities to")
    pp.add_argument("--endpoint", default="", help="S3 URL to publish (with --seaweedfs-config)")
    pp.add_argument("--region", default="us-east-1")
    pp.add_argument("--out", default="", help="also write the credentials JSON here (mode 0600)")
    pp.add_argument("--public-read", action="store_true",
                    help="with --seaweedfs-config: anyone may read and list the bucket without keys (a public "
                         "dataset bucket, docs/data.md)")
    pc = sub.add_parser("check", help="check a credentials JSON (the format provision prints)")
    pc.add_argument("credentials")
    args = p.parse_args(argv)
    try:
        if args.command == "provision":
            creds = provision(args)
            if args.out:
                creds.save(args.out)
            print(json.dumps({**asdict(creds), "commitment": creds.commitment()}, indent=2))
            return 0
        try:
            creds = PeerCredentials.load(args.credentials)
        except ValueError as e:
            raise CliError(str(e)) from None
        problems = check(creds)
        for line in problems:
            print(f"FAIL {line}")
        print("keys ok" if not problems else f"{len(problems)} problem(s): fix the keys' permissions ({DOCS})")
        return 0 if not problems else 1
    except CliError as e:
        print(f"{PROG} {args.command}: {e}", file=sys.stderr)
        return 2
    except (ValueError, OSError, StorageError, BotoCoreError, ClientError) as e:
        print(f"{PROG} {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
