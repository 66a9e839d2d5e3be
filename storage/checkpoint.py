"""The network's checkpoints in S3: sharded safetensors objects, a manifest of their hashes, a "latest" pointer.

Saving (:func:`save_checkpoint`, or :class:`CheckpointSaver` in the background): the parameters (model order)
and the outer state are cut into shards of at most ``shard_bytes`` (storage/checkpoint_manifest.py); each
shard is one safetensors object, sent with a multipart upload when it is larger than the client's
multipart threshold; then the manifest (``checkpoint/{window}-v{v}.json``: the model hash, the outer
state's digest, and every shard's key, size, sha256 and pieces), then ``checkpoint/latest-v{v}.json``
pointing at it.  A reader never sees a manifest before its shards, nor a pointer before its manifest.

Loading (:func:`load_checkpoint`) reads one shard at a time: size cap from the manifest, its sha256, the
strict safetensors header (exactly the pieces the manifest names, their dtypes and shapes), finiteness;
the model hash is recomputed as the shards stream past, in order, and must match the manifest and the
pointer; the outer state must match its digest.  Only then is anything written into a model: the
verified shards wait in a local folder, and :meth:`LoadedCheckpoint.load_into` copies them in shard by
shard (memory-mapped), so loading never holds a second whole model in memory.
:meth:`LoadedCheckpoint.read` gives any slice of a tensor, so ranks of any number can each load their own
(dso/distributed/fsdp.py's slices).  A rejected checkpoint leaves the model untouched.
"""
from __future__ import annotations

import hashlib
import logging
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import safetensors.numpy
import torch
from safetensors import safe_open

from dso.nn.model import state_hash
from dso.protocol.rejections import Reason, Rejection, unexpected
from dso.training.outer import OuterState
from dso.training.outer_rules import outer_rule
from storage import keys
from storage.checkpoint_file import checkpoint_size_cap
from storage.checkpoint_manifest import (
    MANIFEST_MAX_BYTES,
    Manifest,
    Piece,
    Shard,
    encode_manifest,
    expected_tensors,
    parse_manifest,
    plan_shards,
)
from storage.client import MiB, ObjectReader, S3Client, StorageError
from storage.jsonobj import get_json, put_json, rejection_for
from storage.tensorfile import check_spec, load_arrays, read_capped

if TYPE_CHECKING:
    from dso.config.schema import HParams

log = logging.getLogger("dso.checkpoint")
SHARD_FORMAT = "dso-checkpoint-shard"
DEFAULT_SHARD_BYTES = 256 * MiB


@dataclass(frozen=True)
class LatestPointer:
    window: int
    version: int
    key: str
    model_hash: str


# ------------------------------------------------------------------ save
def save_checkpoint(client: S3Client, bucket: str, model: torch.nn.Module, window: int, hp: HParams,
                    run: str = "", outer: OuterState | None = None,
                    shard_bytes: int = DEFAULT_SHARD_BYTES) -> LatestPointer:
    """Upload the checkpoint (θ and the outer state) for ``window``, then move the latest pointer to it."""
    outer = outer or OuterState()
    tensors = [(n, p.detach()) for n, p in model.named_parameters()] + list(outer.tensors().items())
    named = dict(tensors)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    shards = []
    for index, pieces in enumerate(plan_shards(expected_tensors(shapes, outer_rule(hp)), shard_bytes)):
        arrays = {p.name: _rows(named[p.name], p) for p in pieces}
        data = safetensors.numpy.save(arrays, metadata={"format": SHARD_FORMAT, "window": str(window),
                                                        "index": str(index)})
        key = keys.checkpoint_shard(window, index, hp.protocol_version, run)
        client.put(bucket, key, data)
        shards.append(Shard(key, len(data), hashlib.sha256(data).hexdigest(), tuple(pieces)))
    model_hash = state_hash(model.named_parameters())
    manifest = Manifest(window, model_hash, outer.digest(), hp.data_hash, hp.digest(), tuple(shards))
    key = keys.checkpoint(window, hp.protocol_version, run)
    put_json(client, bucket, key, encode_manifest(manifest, hp.protocol_version))
    put_json(client, bucket, keys.latest_checkpoint(hp.protocol_version, run),
             {"window": window, "version": hp.protocol_version, "key": key, "model_hash": model_hash})
    return LatestPointer(window, hp.protocol_version, key, model_hash)


def _rows(tensor: torch.Tensor, piece: Piece) -> np.ndarray:
    t = tensor.reshape(-1) if tensor.dim() == 0 else tensor
    rows = t[piece.start:piece.end].detach().cpu()
    return (rows.float() if rows.is_floating_point() else rows).contiguous().numpy()


class CheckpointSaver:
    """Saves checkpoints on a thread of their own, while the caller goes on with what does not change θ.

    :meth:`start` returns at once; the caller must call :meth:`wait` before it next changes the model or the
    outer state (the validator: before applying the next aggregate), which is where a save that has not
    finished yet stalls it.  ``stalls`` records every wait's seconds (and ``seconds`` each save's length)."""

    def __init__(self, client: S3Client, bucket: str, shard_bytes: int = DEFAULT_SHARD_BYTES):
        self.client, self.bucket, self.shard_bytes = client, bucket, shard_bytes
        self.thread: threading.Thread | None = None
        self.result: LatestPointer | BaseException | None = None
        self.stalls: list[float] = []
        self.seconds: list[float] = []

    def start(self, model: torch.nn.Module, window: int, hp: HParams, run: str, outer: OuterState) -> None:
        self.wait()

        def save() -> None:
            began = time.perf_counter()
            try:
                self.result = save_checkpoint(self.client, self.bucket, model, window, hp, run, outer,
                                              self.shard_bytes)
            except BaseException as e:  # noqa: BLE001 — reported by wait() on the caller's thread
                self.result = e
            self.seconds.append(time.perf_counter() - began)

        self.result = None
        self.thread = threading.Thread(target=save, name=f"checkpoint-{window}", daemon=True)
        self.thread.start()

    def wait(self) -> LatestPointer | None:
        """Block until the running save (if any) is done; its pointer.  A failed save is logged, not raised:
        the next one is due in a few windows."""
        if self.thread is None:
            return None
        began = time.perf_counter()
        self.thread.join()
        self.stalls.append(time.perf_counter() - began)
        self.thread, result = None, self.result
        if isinstance(result, BaseException):
            log.warning("checkpoint not saved: %s: %s", type(result).__name__, result)
            return None
        return result


# ------------------------------------------------------------------ load
class LoadedCheckpoint:
    """A checkpoint whose every shard passed the checks, waiting in a local folder until loaded."""

    def __init__(self, manifest: Manifest, folder: tempfile.TemporaryDirectory[str], outer: OuterState):
        self.window, self.model_hash = manifest.window, manifest.model_hash
        self.data_hash, self.hparams_digest = manifest.data_hash, manifest.hparams
        self.outer = outer
        self.manifest, self.folder = manifest, folder

    def _files(self) -> Iterable[tuple[Path, Shard]]:
        for index, shard in enumerate(self.manifest.shards):
            yield Path(self.folder.name) / f"{index}.safetensors", shard

    @torch.no_grad()
    def load_into(self, model: torch.nn.Module) -> None:
        """θ into ``model`` (whole parameters), one shard at a time."""
        params = dict(model.named_parameters())
        for path, shard in self._files():
            with safe_open(str(path), framework="pt") as f:
                for p in shard.pieces:
                    if p.name in params:
                        params[p.name][p.start:p.end].copy_(f.get_tensor(p.name))

    def read(self, name: str, dim: int = 0, start: int = 0, end: int | None = None) -> torch.Tensor:
        """Rows (``dim`` 0) or columns (``dim`` 1) ``[start, end)`` of one parameter: a rank's slice."""
        parts = []
        for path, shard in self._files():
            for p in shard.pieces:
                if p.name != name:
                    continue
                with safe_open(str(path), framework="pt") as f:
                    rows = f.get_slice(name)
                    if dim == 0:
                        lo, hi = max(start, p.start), p.end if end is None else min(end, p.end)
                        if lo < hi:
                            parts.append(rows[lo - p.start:hi - p.start])
                    else:
                        parts.append(rows[:, start:end])
        return torch.cat(parts)

    def close(self) -> None:
        self.folder.cleanup()


def load_checkpoint(client: ObjectReader, bucket: str, window: int, shapes: dict[str, tuple[int, ...]], hp: HParams,
                    expect_hash: str | None = None, run: str = "") -> LoadedCheckpoint | Rejection:
    """Window's checkpoint, every shard verified (see the module's docstring); never raises."""
    try:
        return _load(client, bucket, window, shapes, hp, expect_hash, run)
    except StorageError as e:
        return rejection_for(e)
    except Exception as e:  # noqa: BLE001 — nothing another party wrote may stop a node
        return unexpected(Reason.MALFORMED, e)


def _load(client: ObjectReader, bucket: str, window: int, shapes: dict[str, tuple[int, ...]], hp: HParams,
          expect_hash: str | None, run: str) -> LoadedCheckpoint | Rejection:
    obj = get_json(client, bucket, keys.checkpoint(window, hp.protocol_version, run), max_bytes=MANIFEST_MAX_BYTES)
    if isinstance(obj, Rejection):
        return obj
    manifest = parse_manifest(obj, shapes, outer_rule(hp), hp.protocol_version, window, run,
                              checkpoint_size_cap(shapes), hp.digest())
    if isinstance(manifest, Rejection):
        return manifest
    if expect_hash is not None and manifest.model_hash != expect_hash:
        return Rejection(Reason.METADATA_MISMATCH, "checkpoint model_hash differs from the latest pointer's")
    folder = tempfile.TemporaryDirectory(prefix="dso-checkpoint-")
    digest = hashlib.sha256()
    outer_parts: dict[str, list[torch.Tensor]] = {}
    dtypes = {n: d for n, d, _ in expected_tensors(shapes, outer_rule(hp))}
    full = {n: s for n, _, s in expected_tensors(shapes, outer_rule(hp))}
    for index, shard in enumerate(manifest.shards):
        data = client.get(bucket, shard.key, max_bytes=shard.size)
        bad = _check_shard(data, shard, index, window, dtypes, full)
        arrays = load_arrays(data) if bad is None else bad
        if isinstance(arrays, Rejection):
            folder.cleanup()
            return arrays
        for p in shard.pieces:
            rows = arrays[p.name]
            if rows.dtype == np.float32 and not np.isfinite(rows).all():
                folder.cleanup()
                return Rejection(Reason.NON_FINITE, f"{p.name[:64]}: non-finite value")
            if p.name in shapes:  # the model hash of state_hash, streamed: name and shape, then the rows in order
                if p.start == 0:
                    digest.update(p.name.encode())
                    digest.update(str(tuple(shapes[p.name])).encode())
                digest.update(np.ascontiguousarray(rows).tobytes())
            else:
                outer_parts.setdefault(p.name, []).append(torch.from_numpy(rows.copy()))
        (Path(folder.name) / f"{index}.safetensors").write_bytes(data)
        del data, arrays
    if digest.hexdigest() != manifest.model_hash:
        folder.cleanup()
        return Rejection(Reason.METADATA_MISMATCH, f"model hash mismatch: content {digest.hexdigest()[:16]}…, "
                         f"manifest {manifest.model_hash[:16]}…")
    outer = OuterState.from_tensors({k: torch.cat(v) for k, v in outer_parts.items()}, shapes, hp)
    if outer is None or outer.digest() != manifest.outer_digest:
        folder.cleanup()
        return Rejection(Reason.METADATA_MISMATCH, "outer state does not match outer_digest (or is not finite)")
    return LoadedCheckpoint(manifest, folder, outer)


def _check_shard(data: bytes, shard: Shard, index: int, window: int, dtypes: dict[str, str],
                 full: dict[str, tuple[int, ...]]) -> Rejection | None:
    if hashlib.sha256(data).hexdigest() != shard.sha256:
        return Rejection(Reason.METADATA_MISMATCH, f"checkpoint shard {index}: sha256 differs from the manifest's")
    header = read_capped(data, shard.size, len(shard.pieces), {"format", "window", "index"})
    if isinstance(header, Rejection):
        return header
    if header.metadata != {"format": SHARD_FORMAT, "window": str(window), "index": str(index)}:
        return Rejection(Reason.METADATA_MISMATCH, f"checkpoint shard {index}: metadata")
    spec = {p.name: (dtypes[p.name], (p.end - p.start, *full[p.name][1:])) for p in shard.pieces}
    return check_spec(header, spec)


def read_latest(client: ObjectReader, bucket: str, version: int, run: str = "") -> LatestPointer | Rejection:
    obj = get_json(client, bucket, keys.latest_checkpoint(version, run), max_bytes=4096)
    if isinstance(obj, Rejection):
        return obj
    if set(obj) != {"window", "version", "key", "model_hash"}:
        return Rejection(Reason.MALFORMED, f"latest pointer keys {sorted(obj)[:6]}")
    window, ver, key, h = obj["window"], obj["version"], obj["key"], obj["model_hash"]
    if isinstance(window, bool) or not isinstance(window, int) or window < 0 or ver != version:
        return Rejection(Reason.METADATA_MISMATCH, "latest pointer: bad window or version")
    if key != keys.checkpoint(window, version, run):  # never follow an arbitrary key (or another run's)
        return Rejection(Reason.MALFORMED, "latest pointer: key does not match its window")
    if not isinstance(h, str) or len(h) != 64:
        return Rejection(Reason.MALFORMED, "latest pointer: model_hash is not a sha256 hex digest")
    return LatestPointer(window, version, key, h)


def load_latest_checkpoint(client: ObjectReader, bucket: str, shapes: dict[str, tuple[int, ...]],
                           hp: HParams, run: str = "") -> LoadedCheckpoint | Rejection:
    """Follow the latest pointer; the checkpoint must hash to what the pointer says."""
    pointer = read_latest(client, bucket, hp.protocol_version, run)
    if isinstance(pointer, Rejection):
        return pointer
    return load_checkpoint(client, bucket, pointer.window, shapes, hp, expect_hash=pointer.model_hash, run=run)
