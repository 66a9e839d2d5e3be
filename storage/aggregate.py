"""The window's bundle: exactly the payloads the leading validator aggregated, in aggregation order.

Object ``{run}/aggregate/{window}-v{v}.safetensors``.  Tensors: ``payload.{uid}``
(uint8, the payload's bytes exactly as its miner signed them, see storage/wire.py)
for every aggregated uid.  Metadata: ``format``, ``protocol_version``, ``window``,
``hparams``, ``uids`` (comma-separated, aggregation order), ``sha256``
(comma-separated content hashes, same order), ``signatures`` (each payload's
miner signature, same order: dso/protocol/signatures.py), ``model_hash_before`` and
``model_hash_after``, ``outer_digest_before`` and ``outer_digest_after`` (the outer
optimiser's state around the step, dso/training/outer.py ``OuterState.digest``).  With θ_t
and the outer state at t (a checkpoint holds both) the payloads are all a node needs
to replay the window's outer step.

Every node applies the leader's bundle for window t — miners following the
network, other validators, a node catching up — so every honest node
aggregates exactly the same set of payloads, identified by content hash, and
a peer that deletes or rewrites its object after the put window cannot split
the network's view of the window.  Replaying a bundle is the same computation
as the validator's (neurons/engine.py ``aggregate_window``) and the model hashes
and outer-state digests are checked.

Decoding is strict and never raises: size cap, header, metadata, exact tensor
set, content hashes, and every payload through :func:`storage.wire.decode_payload`.
A bundle is applied only when every payload in it carries its miner's valid
signature for the window (:func:`unsigned`): a leader cannot slip in bytes no miner
signed (docs/protocol.md, "A leader nobody has to trust").
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import safetensors.numpy

from dso.codec.codecs import Codec
from dso.protocol import signatures
from dso.protocol.payload import Payload
from dso.protocol.rejections import Reason, Rejection, unexpected
from storage import keys
from storage.client import ObjectReader, S3Client, StorageError
from storage.jsonobj import rejection_for
from storage.tensorfile import check_spec, header_allowance, load_arrays, parse_uint, read_capped
from storage.wire import Expect, decode_payload, encode_payload, payload_size_cap

if TYPE_CHECKING:
    from dso.config.schema import HParams

FORMAT = "dso-bundle"
_HEX = set("0123456789abcdef")
_DIGESTS = ("model_hash_before", "model_hash_after", "outer_digest_before", "outer_digest_after")
_FIELDS = {"format", "protocol_version", "window", "hparams", "uids", "sha256", "signatures", *_DIGESTS}


@dataclass
class Bundle:
    window: int
    uids: list[int]                    # aggregation order
    payloads: dict[int, Payload]
    model_hash_before: str
    model_hash_after: str
    outer_digest_before: str = ""
    outer_digest_after: str = ""
    nbytes: int = 0                    # size of the object read


def bundle_size_cap(codec: Codec, sync_samples: int, max_peers: int) -> int:
    return 8 + header_allowance(max_peers) + 232 * max_peers + max_peers * payload_size_cap(codec, sync_samples)


def unsigned(bundle: Bundle, hotkeys: Mapping[int, str], run: str) -> dict[int, Rejection]:
    """uid → why its payload in the bundle does not carry its miner's signature for the window (UNSIGNED or
    BAD_SIGNATURE against ``hotkeys``, uid → hotkey on chain); empty when every one does."""
    out: dict[int, Rejection] = {}
    for uid in bundle.uids:
        payload = bundle.payloads[uid]
        if not payload.signature:
            out[uid] = Rejection(Reason.UNSIGNED, f"bundle payload of uid {uid} carries no signature")
            continue
        problem = signatures.signature_problem(hotkeys.get(uid, ""), run, bundle.window, uid, payload.sha256,
                                               payload.signature)
        if problem:
            out[uid] = Rejection(Reason.BAD_SIGNATURE, f"bundle payload of uid {uid}: {problem}")
    return out


def encode_bundle(codec: Codec, window: int, uids: Sequence[int], payloads: Mapping[int, Payload],
                  model_hash_before: str, model_hash_after: str, protocol_version: int, hparams_digest: str,
                  outer_digest_before: str, outer_digest_after: str) -> bytes:
    """The bundle of ``uids`` (in aggregation order): each payload's bytes as its miner signed them, with the
    signature (a payload that was never read from the wire, e.g. in the simulator, is encoded canonically and
    carries none: no follower applies it)."""
    blobs = {u: payloads[u].raw or encode_payload(codec, payloads[u].update, payloads[u].sync_values,
                                                  payloads[u].meta) for u in uids}
    tensors = {f"payload.{u}": np.frombuffer(blobs[u], dtype=np.uint8) for u in uids}
    metadata = {"format": FORMAT, "protocol_version": str(protocol_version), "window": str(window),
                "hparams": hparams_digest, "uids": ",".join(str(u) for u in uids),
                "sha256": ",".join(hashlib.sha256(blobs[u]).hexdigest() for u in uids),
                "signatures": ",".join(payloads[u].signature if payloads[u].raw else "" for u in uids),
                "model_hash_before": model_hash_before, "model_hash_after": model_hash_after,
                "outer_digest_before": outer_digest_before, "outer_digest_after": outer_digest_after}
    return safetensors.numpy.save(tensors, metadata=metadata)


def decode_bundle(data: bytes, codec: Codec, expect: Expect, max_peers: int) -> Bundle | Rejection:
    """Strictly validate a bundle for ``expect.window``; never raises."""
    try:
        return _decode(data, codec, expect, max_peers)
    except Exception as e:  # noqa: BLE001 — last line of defence: a bug must not stop a node
        return unexpected(Reason.MALFORMED, e)


def _decode(data: bytes, codec: Codec, expect: Expect, max_peers: int) -> Bundle | Rejection:
    header = read_capped(data, bundle_size_cap(codec, expect.sync_samples, max_peers), max_peers, _FIELDS)
    if isinstance(header, Rejection):
        return header
    md = header.metadata
    for name, want in (("format", FORMAT), ("protocol_version", str(expect.protocol_version)),
                       ("window", str(expect.window)), ("hparams", expect.hparams_digest)):
        if md[name] != want:
            return Rejection(Reason.METADATA_MISMATCH, f"bundle {name}: got {md[name][:64]!r}, expected {want!r}")
    uids = [parse_uint(u) for u in md["uids"].split(",")] if md["uids"] else []
    hashes = md["sha256"].split(",") if md["sha256"] else []
    if any(u is None for u in uids) or len(set(uids)) != len(uids) or len(uids) > max_peers:
        return Rejection(Reason.METADATA_MISMATCH, f"bundle uids must be at most {max_peers} distinct integers")
    if len(hashes) != len(uids) or not all(len(h) == 64 and set(h) <= _HEX for h in hashes):
        return Rejection(Reason.METADATA_MISMATCH, "bundle sha256 must hold one hex digest per uid")
    sigs = md["signatures"].split(",") if uids else []
    if md["signatures"] and not uids or len(sigs) != len(uids) or \
            not all(sig == "" or signatures.is_signature(sig) for sig in sigs):
        return Rejection(Reason.METADATA_MISMATCH, "bundle signatures must hold one hex signature (or none) per uid")
    for name in _DIGESTS:
        if len(md[name]) != 64 or not set(md[name]) <= _HEX:
            return Rejection(Reason.METADATA_MISMATCH, f"bundle {name} is not a sha256 hex digest")
    cap = payload_size_cap(codec, expect.sync_samples)
    wanted = {f"payload.{u}" for u in uids}
    if set(header.entries) != wanted or any(len(e.shape) != 1 or e.shape[0] > cap for e in header.entries.values()):
        return Rejection(Reason.BAD_KEYS, "bundle tensors must be exactly one payload per listed uid")
    bad = check_spec(header, {k: ("uint8", e.shape) for k, e in header.entries.items()})
    if bad:
        return bad
    arrays = load_arrays(data)
    if isinstance(arrays, Rejection):
        return arrays
    payloads: dict[int, Payload] = {}
    for uid, digest, sig in zip(uids, hashes, sigs, strict=True):
        assert uid is not None
        blob = arrays[f"payload.{uid}"].tobytes()
        if hashlib.sha256(blob).hexdigest() != digest:
            return Rejection(Reason.METADATA_MISMATCH, f"bundle payload of uid {uid} does not match its sha256")
        payload = decode_payload(blob, codec, expect.for_uid(uid))
        if isinstance(payload, Rejection):
            return Rejection(payload.reason, f"bundle payload of uid {uid}: {payload.detail}")
        payload.raw, payload.sha256, payload.signature = blob, digest, sig
        payloads[uid] = payload
    return Bundle(expect.window, [u for u in uids if u is not None], payloads, md["model_hash_before"],
                  md["model_hash_after"], md["outer_digest_before"], md["outer_digest_after"], len(data))


def put_bundle(client: S3Client, bucket: str, data: bytes, window: int, protocol_version: int, run: str = "") -> str:
    key = keys.aggregate(window, protocol_version, run)
    client.put(bucket, key, data)
    return key


def get_bundle(client: ObjectReader, bucket: str, codec: Codec, hp: HParams, window: int, run: str = ""
               ) -> Bundle | Rejection:
    """The bundle of ``window`` from ``bucket`` (a Rejection when absent or unusable)."""
    expect = Expect.from_hparams(hp, window, run=run)
    cap = bundle_size_cap(codec, expect.sync_samples, hp.topg)
    try:
        data = client.get(bucket, keys.aggregate(window, hp.protocol_version, run), max_bytes=cap)
    except StorageError as e:
        return rejection_for(e)
    return decode_bundle(data, codec, expect, hp.topg)
