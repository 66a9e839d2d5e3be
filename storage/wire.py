"""A miner's gradient payload on the wire: safetensors with a strict validator (design §3).

Tensors: exactly ``codec.wire_spec()`` (the compressed update, whatever the
codec) plus ``sync.values`` (float32, ``sync_samples`` long: θ_t at the
positions chosen for SyncScore).  ``__metadata__`` (all strings): ``format``,
``protocol_version``, ``uid``, ``window``, ``hparams`` (HParams digest),
``data_hash``, ``model_hash`` (θ the miner trained from), ``trained`` (sequences of
its assignment it trained on, from the first) and the codec settings as ``codec.<name>``.

:func:`decode_payload` never raises: it returns a :class:`Payload` or a
:class:`~dso.protocol.rejections.Rejection`.  Order of checks: size cap → container
(header) → metadata → key set → dtypes → shapes → codec content (index range,
count per chunk, encoding, finiteness) → sync values.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import safetensors.numpy
import torch

from dso.codec.codecs import Codec, Update
from dso.codec.packing import PackingError
from dso.nn.model import sync_sample_count
from dso.protocol.payload import Payload, PayloadMeta
from dso.protocol.rejections import Reason, Rejection, unexpected
from storage.tensorfile import check_spec, header_allowance, load_arrays, parse_uint, read_header

if TYPE_CHECKING:
    from dso.config.schema import HParams

FORMAT = "dso-update"
SYNC_KEY = "sync.values"
_HASH_CHARS = set("0123456789abcdef")


@dataclass(frozen=True)
class Expect:
    """What a reader requires of a payload.  ``None`` fields are not checked."""

    window: int
    protocol_version: int
    hparams_digest: str
    sync_samples: int
    uid: int | None = None
    data_hash: str | None = None
    model_hash: str | None = None
    run: str = ""                  # the network run the payload is read under (its key prefix)
    max_trained: int | None = None  # the most sequences a payload may declare it trained on (the assignment)
    # the hotkey whose signature the payload must carry (dso/protocol/signatures.py); None: not checked (tools, tests);
    # "" : required, but the uid has no hotkey on chain, so nothing can pass
    signer: str | None = None

    @classmethod
    def from_hparams(cls, hp: HParams, window: int, *, data_hash: str | None = None, **kw: Any) -> Expect:
        """What the run's settings require of window ``window``'s payloads.  ``data_hash``: the run's data
        hash (the node's ``Dataset.data_hash``); by default ``hp.data_hash`` when the run pins one, so a
        payload trained on other data is a ``METADATA_MISMATCH`` (docs/protocol.md)."""
        if data_hash is None:
            data_hash = hp.data_hash or None
        return cls(window=window, protocol_version=hp.protocol_version, hparams_digest=hp.digest(),
                   sync_samples=sync_sample_count(hp), data_hash=data_hash, max_trained=hp.assigned_sequences, **kw)

    def for_uid(self, uid: int) -> Expect:
        return replace(self, uid=uid)

    def for_peer(self, uid: int, hotkeys: Mapping[int, str] | None) -> Expect:
        """For one uid, signed by its hotkey in ``hotkeys`` (None: signatures not checked)."""
        return replace(self, uid=uid, signer=None if hotkeys is None else hotkeys.get(uid, ""))


def full_spec(codec: Codec, sync_samples: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    spec = dict(codec.wire_spec())
    if SYNC_KEY in spec:
        raise ValueError(f"codec wire spec must not use the key {SYNC_KEY!r}")
    spec[SYNC_KEY] = ("float32", (sync_samples,))
    return spec


def payload_size_cap(codec: Codec, sync_samples: int) -> int:
    """Largest acceptable payload in bytes: exact tensor bytes + a header allowance."""
    spec = full_spec(codec, sync_samples)
    data = sum(math.prod(shape) * np.dtype(dtype).itemsize for dtype, shape in spec.values())
    return 8 + header_allowance(len(spec)) + data


def _metadata(meta: PayloadMeta, codec: Codec) -> dict[str, str]:
    md = {"format": FORMAT, "protocol_version": str(meta.protocol_version), "uid": str(meta.uid),
          "window": str(meta.window), "hparams": meta.hparams_digest, "data_hash": meta.data_hash,
          "model_hash": meta.model_hash, "trained": str(meta.trained)}
    md.update({f"codec.{k}": str(v) for k, v in codec.settings().items()})
    return md


def encode_payload(codec: Codec, update: Update, sync_values: torch.Tensor, meta: PayloadMeta) -> bytes:
    """Serialise our own update.  Raises ValueError if it would not pass our own validator's shape checks."""
    tensors = {k: np.ascontiguousarray(v) for k, v in codec.to_wire(update).items()}
    sync = sync_values.detach().to("cpu", torch.float32).contiguous().reshape(-1).numpy()
    tensors[SYNC_KEY] = sync
    spec = full_spec(codec, sync.size)
    for key, (dtype, shape) in spec.items():
        arr = tensors.get(key)
        if arr is None or arr.dtype != np.dtype(dtype) or tuple(arr.shape) != tuple(shape):
            raise ValueError(f"encode: tensor {key} does not match the codec's wire spec {dtype}{list(shape)}")
    if set(tensors) != set(spec):
        raise ValueError(f"encode: unexpected tensors {sorted(set(tensors) - set(spec))[:4]}")
    return safetensors.numpy.save(tensors, metadata=_metadata(meta, codec))


def _parse_meta(md: dict[str, str], codec: Codec) -> PayloadMeta | Rejection:
    want = set(_metadata(PayloadMeta(0, 0, 0, ""), codec))
    if set(md) != want:
        missing, extra = sorted(want - set(md)), sorted(set(md) - want)
        return Rejection(Reason.METADATA_MISMATCH, f"metadata keys: missing {missing[:4]}, extra {extra[:4]}")
    if md["format"] != FORMAT:
        return Rejection(Reason.METADATA_MISMATCH, f"format {md['format'][:32]!r}, expected {FORMAT!r}")
    nums = {k: parse_uint(md[k]) for k in ("protocol_version", "uid", "window", "trained")}
    for k, v in nums.items():
        if v is None:
            return Rejection(Reason.METADATA_MISMATCH, f"{k}: {md[k][:32]!r} is not a canonical integer")
    ints = {k: v for k, v in nums.items() if v is not None}  # all of them (checked above)
    for k in ("hparams", "data_hash", "model_hash"):
        if len(md[k]) > 128 or not set(md[k]) <= _HASH_CHARS:
            return Rejection(Reason.METADATA_MISMATCH, f"{k}: not a lowercase hex digest")
    return PayloadMeta(uid=ints["uid"], window=ints["window"], protocol_version=ints["protocol_version"],
                       hparams_digest=md["hparams"], data_hash=md["data_hash"], model_hash=md["model_hash"],
                       trained=ints["trained"])


def _compare(meta: PayloadMeta, md: dict[str, str], codec: Codec, expect: Expect) -> Rejection | None:
    checks = [("protocol_version", meta.protocol_version, expect.protocol_version),
              ("window", meta.window, expect.window),
              ("hparams", meta.hparams_digest, expect.hparams_digest)]
    if expect.uid is not None:
        checks.append(("uid", meta.uid, expect.uid))
    if expect.data_hash is not None:
        checks.append(("data_hash", meta.data_hash, expect.data_hash))
    if expect.model_hash is not None:
        checks.append(("model_hash", meta.model_hash, expect.model_hash))
    if expect.max_trained is not None and meta.trained > expect.max_trained:
        return Rejection(Reason.METADATA_MISMATCH, f"trained: {meta.trained} sequences declared, more than the "
                         f"{expect.max_trained} assigned")
    checks += [(f"codec.{k}", md[f"codec.{k}"], str(v)) for k, v in codec.settings().items()]
    for name, got, want in checks:
        if got != want:
            return Rejection(Reason.METADATA_MISMATCH, f"{name}: got {str(got)[:64]!r}, expected {str(want)[:64]!r}")
    return None


def _packing_reason(e: PackingError) -> Reason:
    try:
        return Reason(e.reason)
    except ValueError:
        return Reason.BAD_ENCODING


def decode_payload(data: bytes, codec: Codec, expect: Expect) -> Payload | Rejection:
    """Validate and decode another peer's payload bytes; never raises."""
    try:
        return _decode(data, codec, expect)
    except Exception as e:  # noqa: BLE001 — last line of defence: a bug must not stop a validator
        return unexpected(Reason.MALFORMED, e)


def _decode(data: bytes, codec: Codec, expect: Expect) -> Payload | Rejection:
    spec = full_spec(codec, expect.sync_samples)
    cap = payload_size_cap(codec, expect.sync_samples)
    if len(data) > cap:
        return Rejection(Reason.TOO_LARGE, f"{len(data)} bytes, cap {cap}")
    header = read_header(data, header_allowance(len(spec)))
    if isinstance(header, Rejection):
        return header
    meta = _parse_meta(header.metadata, codec)
    if isinstance(meta, Rejection):
        return meta
    bad = _compare(meta, header.metadata, codec, expect) or check_spec(header, spec)
    if bad:
        return bad
    arrays = load_arrays(data)
    if isinstance(arrays, Rejection):
        return arrays
    sync = arrays.pop(SYNC_KEY)
    try:
        update = codec.from_wire(arrays, expect.window)
    except PackingError as e:
        return Rejection(_packing_reason(e), str(e)[:200])
    if not np.isfinite(sync).all():
        return Rejection(Reason.NON_FINITE, f"{SYNC_KEY}: non-finite sample")
    return Payload(meta, update, torch.from_numpy(np.array(sync, dtype=np.float32)), len(data))
