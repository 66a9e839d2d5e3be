"""Embedded S3 for the local network and tests: a moto server on loopback with IAM authentication on.

It runs in its own process (``python -m storage.server``), so its in-memory
state and moto's process-wide auth switch never leak into the caller.  Start
up: serve with auth off but only for a one-off bootstrap key, create an
``dso-admin`` IAM user (``*`` on ``*``), switch IAM enforcement on, verify that
an unknown key is refused, then write the admin credentials file (mode 0600).
From then on every request must be SigV4-signed by a known IAM key and is
checked against that user's policies; moto's unauthenticated control API
(``/moto-api``, which could switch auth off) is blocked.

Peers are provisioned over HTTP with the admin key (:func:`provision_peer`), so
it works after auth is on and from any process: bucket ``dso-<name>``, a write
user (``s3:*`` on that bucket only) and a read-only user (``s3:GetObject`` and
``s3:ListBucket`` on it).  State lives in memory and ends with the process.

    python -m storage.server --port 9090 --admin-file ~/.dso/localnet/s3-admin.json
    python -m storage.server provision alice --admin-file ~/.dso/localnet/s3-admin.json
    python -m storage.server check alice.json      # keys made by any provider (R2, MinIO, ...)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dso.util import processes
from dso.util.processes import spawn
from storage.client import S3Client, StorageError
from storage.credentials import (  # noqa: F401 (re-exported)
    ADMIN_USER,
    BUCKET_PREFIX,
    REGION,
    AdminCredentials,
    PeerCredentials,
    iam_client,
    provision_peer,
)
from storage.engines import Engine

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

DEFAULT_ADMIN_FILE = "~/.dso/localnet/s3-admin.json"


# ------------------------------------------------------------ parent side
class EmbeddedS3(Engine):
    """Handle on an embedded S3 server process started by :meth:`start` (the ``moto`` engine)."""

    name = "moto"

    def __init__(self, admin: AdminCredentials, process: subprocess.Popen[bytes] | None = None,
                 state_dir: str | None = None):
        self.admin = admin
        self._process = process
        self._state_dir = state_dir

    @property
    def endpoint(self) -> str:
        return self.admin.endpoint

    @property
    def region(self) -> str:
        return self.admin.region

    @classmethod
    def start(cls, port: int = 0, host: str = "127.0.0.1", timeout: float = 60.0,
              verbose: bool = False) -> EmbeddedS3:
        """Start a server process (port 0 = any free port) and wait until auth is on."""
        state_dir = tempfile.mkdtemp(prefix="dso-s3-")
        admin_file = Path(state_dir) / "admin.json"
        log_path = Path(state_dir) / "server.log"
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        cmd = [sys.executable, "-m", "storage.server", "--host", host, "--port", str(port),
               "--admin-file", str(admin_file), "--parent-pid", str(os.getpid())] + (["--verbose"] if verbose else [])
        with open(log_path, "wb") as log:  # own process group; dies with us even when we are SIGKILLed
            process = spawn(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=root)
        deadline = time.monotonic() + timeout
        while not admin_file.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                process.wait()
                tail = log_path.read_text(errors="replace")[-2000:]
                shutil.rmtree(state_dir, ignore_errors=True)
                raise RuntimeError(f"embedded S3 server did not start (exit {process.returncode}):\n{tail}")
            time.sleep(0.05)
        return cls(AdminCredentials.load(admin_file), process, state_dir)

    @classmethod
    def attach(cls, admin_file: str | Path = DEFAULT_ADMIN_FILE) -> EmbeddedS3:
        """Use a server someone else started (e.g. ``python -m storage.server``)."""
        return cls(AdminCredentials.load(admin_file))

    def provision(self, name: str, create_bucket: bool = True) -> PeerCredentials:
        return provision_peer(self.admin, name, create_bucket)

    def stop(self) -> None:
        if self._process is not None:
            processes.stop(self._process, timeout=10)
        if self._state_dir:
            shutil.rmtree(self._state_dir, ignore_errors=True)


# ------------------------------------------------------------- child side
class _Guard:
    """WSGI filter in front of moto: only SigV4-signed S3/IAM calls, each to its service's app (``apps``, by
    the signature's service); no moto control API.

    It routes by the signature rather than through moto's host dispatcher, which lists moto's service
    packages on disk for every request (a quarter of the server's CPU under a local network's polling).
    Until ``ready`` only the bootstrap key may call (closes the window before auth is on)."""

    def __init__(self, apps: Mapping[str, WSGIApplication], bootstrap_key: str):
        self.apps, self.bootstrap_key, self.ready = apps, bootstrap_key, False

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        auth = environ.get("HTTP_AUTHORIZATION", "")
        m = re.match(r"AWS4-HMAC-SHA256 Credential=([^/,\s]+)/[0-9]{8}/[^/]+/([^/]+)/aws4_request", auth)
        problem = None
        if path.startswith(("/moto-api", "/latest/")) or path == "/favicon.ico":
            problem = "moto control API is disabled"
        elif not m:
            problem = "only SigV4-signed requests are accepted"
        elif m.group(2) not in self.apps:
            problem = f"service {m.group(2)} is not offered"
        elif not self.ready and m.group(1) != self.bootstrap_key:
            problem = "server is starting"
        if problem is None and m:
            return self.apps[m.group(2)](environ, start_response)
        body = f"<Error><Code>AccessDenied</Code><Message>{problem}</Message></Error>".encode()
        start_response("403 Forbidden", [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
        return [body]


def serve(host: str, port: int, admin_file: str, verbose: bool = False, parent_pid: int | None = None,
          stop: threading.Event | None = None) -> None:
    from moto import settings
    from moto.core.authorization import ActionAuthenticatorMixin
    from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    class Handler(MotoRequestHandler):
        def log_request(self, *args: Any, **kw: Any) -> None:
            if verbose:
                super().log_request(*args, **kw)

    settings.INITIAL_NO_AUTH_ACTION_COUNT = float("inf")
    bootstrap_key, bootstrap_secret = "AKIDBOOT" + secrets.token_hex(6).upper(), secrets.token_hex(20)
    guard = _Guard({"s3": create_backend_app("s3"), "iam": create_backend_app("iam")}, bootstrap_key)
    server = make_server(host, port, guard, threaded=True, request_handler=Handler)
    # only once the port is ours: a stale admin file must not look like "ready"
    Path(admin_file).expanduser().unlink(missing_ok=True)
    threading.Thread(target=server.serve_forever, daemon=True, name="moto-server").start()
    endpoint = f"http://{host}:{server.server_address[1]}"

    iam = iam_client(endpoint, bootstrap_key, bootstrap_secret)
    iam.create_user(UserName=ADMIN_USER)
    iam.put_user_policy(UserName=ADMIN_USER, PolicyName="admin", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName=ADMIN_USER)["AccessKey"]
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0       # from now on every request is authenticated
    ActionAuthenticatorMixin.request_count = 0
    guard.ready = True
    _self_check(endpoint)
    admin = AdminCredentials(endpoint, REGION, key["AccessKeyId"], key["SecretAccessKey"])
    admin.save(admin_file)
    print(f"embedded S3 (moto, IAM auth on) at {endpoint}\nadmin credentials: {admin_file}", flush=True)
    stop = stop or threading.Event()
    while not stop.wait(0.5):
        if parent_pid is not None and os.getppid() != parent_pid:
            break  # the process that started us is gone: do not linger
    server.shutdown()


def _self_check(endpoint: str) -> None:
    """Refuse to run if a key nobody was given can read: auth is then not really on."""
    probe = S3Client(endpoint, REGION, "AKIAPROBE" + secrets.token_hex(6).upper(), secrets.token_hex(20),
                     timeout=10, max_attempts=1)
    try:
        probe.list("dso-auth-probe")
    except StorageError as e:
        if e.kind == "denied":
            return
        raise RuntimeError(f"auth self-check failed unexpectedly: {e}") from None
    raise RuntimeError("auth self-check failed: an unknown key was accepted")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("provision", "check"):
        from storage.provision_cli import main as provision_main

        return provision_main(argv)
    p = argparse.ArgumentParser(prog="python -m storage.server", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1", help="bind address (keep it on loopback)")
    p.add_argument("--port", type=int, default=9090, help="0 = any free port")
    p.add_argument("--admin-file", default=DEFAULT_ADMIN_FILE, help="where to write the admin credentials")
    p.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--verbose", action="store_true", help="log every request")
    a = p.parse_args(argv)
    import signal
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        serve(a.host, a.port, a.admin_file, a.verbose, a.parent_pid, stop)
    except OSError as e:
        print(f"storage.server: cannot serve on {a.host}:{a.port}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
