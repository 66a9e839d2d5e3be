"""Publishing a shard folder to a dataset bucket (``scripts/prepare_data.py FOLDER --upload s3://BUCKET/PREFIX``).

Every shard is checked against the manifest first (sha256, chunk digests, ids within the vocabulary), so
a damaged folder is never published.  Objects go up in an order that never shows a reader a manifest
whose objects are missing: each shard and its ``.chunks`` file, ``tokenizer.json``, then ``manifest.json``
last.  Shards are streamed from disk (multipart), never held in memory whole.

Keys come as for the nodes: ``--storage.credentials FILE`` (the JSON ``python -m storage.server provision``
prints, or any JSON with ``access_key_id``/``secret_access_key``), else ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY``; the endpoint from ``--storage.endpoint``, else the file's.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dso.data.corpus import DataError
from dso.data.shards import MANIFEST, TOKENIZER_FILE, chunks_name, open_shards, verify_shard
from storage.client import S3Client
from storage.dataset import CorpusURL


@dataclass(frozen=True)
class Published:
    url: str
    data_hash: str
    objects: int
    nbytes: int


def upload_client(endpoint: str, region: str, credentials: str = "") -> S3Client:
    """A write client for the dataset bucket: keys from ``credentials`` (a JSON file) or the environment."""
    key = secret = ""
    if credentials:
        path = Path(credentials).expanduser()
        try:
            obj = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"--storage.credentials {path}: cannot read it as JSON ({e})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"--storage.credentials {path}: expected a JSON object")
        key = obj.get("write_key_id") or obj.get("access_key_id") or ""
        secret = obj.get("write_secret") or obj.get("secret_access_key") or ""
        if not (isinstance(key, str) and isinstance(secret, str) and key and secret):
            raise ValueError(f"--storage.credentials {path}: needs write_key_id/write_secret (as `provision` "
                             "writes them) or access_key_id/secret_access_key")
        endpoint = endpoint or str(obj.get("endpoint") or "")
        region = region or str(obj.get("region") or "")
    return S3Client(endpoint or None, region or "us-east-1", key, secret)


def publish(folder: str | Path, url: str, client: S3Client, progress: Callable[[int], None] | None = None,
            create_bucket: bool = True) -> Published:
    """Upload the shard folder to ``url``; DataError for a folder that does not check out, StorageError
    for the store's refusals.  ``progress`` hears the shard bytes uploaded."""
    where = CorpusURL.parse(url)
    shards = open_shards(folder, verify=False)   # the manifest and the tokeniser are checked here
    manifest, root = shards.manifest, shards.folder
    if not manifest.chunk_bytes:
        raise DataError(f"{root / MANIFEST}: a version-1 manifest (no chunk digests); make the shards again with "
                        "scripts/prepare_data.py")
    if create_bucket:
        client.ensure_bucket(where.bucket)
    objects, nbytes = 0, 0
    for info in manifest.shards:
        path = root / info.file
        scan = verify_shard(path, info, manifest)
        nbytes += client.put_file(where.bucket, where.key(info.file), path)
        client.put(where.bucket, where.key(chunks_name(info.file)), scan.chunks)
        objects, nbytes = objects + 2, nbytes + len(scan.chunks)
        if progress:
            progress(path.stat().st_size)
    if manifest.tokenizer_kind == "bpe":
        nbytes += client.put_file(where.bucket, where.key(TOKENIZER_FILE), root / TOKENIZER_FILE)
        objects += 1
    nbytes += client.put_file(where.bucket, where.key(MANIFEST), root / MANIFEST)
    return Published(str(where), shards.data_hash, objects + 1, nbytes)
