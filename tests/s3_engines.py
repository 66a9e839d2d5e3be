"""Start an S3 engine for a test module (imported by name: tests/ is on sys.path under pytest)."""
from __future__ import annotations


def start_s3_engine(request, kind: str):
    """(engine, stop): a moto server of the module's own, or the session's SeaweedFS server (stop None).

    SeaweedFS comes from the ``seaweedfs_engine`` session fixture, which skips with its reason where the
    ``weed`` binary is missing."""
    if kind == "seaweedfs":
        return request.getfixturevalue("seaweedfs_engine"), None
    from storage.server import EmbeddedS3

    server = EmbeddedS3.start()
    return server, server.stop
