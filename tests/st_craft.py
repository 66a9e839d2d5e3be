"""Hand-built safetensors bytes for crafting hostile payloads in tests (independent of the encoder)."""
from __future__ import annotations

import json

import torch

from dso.protocol.payload import PayloadMeta
from storage.wire import encode_payload


def build(entries: dict[str, tuple[str, list[int], bytes]], metadata: dict | None) -> bytes:
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, raw) in entries.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return len(h).to_bytes(8, "little") + h + b"".join(blobs)


def split(data: bytes) -> tuple[dict[str, tuple[str, list[int], bytes]], dict]:
    """Inverse of build for a well-formed file: editable entries + metadata."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    metadata = header.pop("__metadata__", {})
    body = data[8 + n:]
    entries = {k: (v["dtype"], v["shape"], body[v["data_offsets"][0]:v["data_offsets"][1]])
               for k, v in header.items()}
    return entries, metadata


def honest(codec, update, hp, uid: int, window: int, sync=None) -> bytes:
    sync = torch.linspace(-1, 1, hp.sync_samples) if sync is None else sync
    meta = PayloadMeta(uid=uid, window=window, protocol_version=hp.protocol_version, hparams_digest=hp.digest())
    return encode_payload(codec, update, sync, meta)


def _copy(update):
    from dso.codec.demo import TensorUpdate
    return {n: TensorUpdate(u.idx.clone(), u.codes.clone(), u.scale.clone()) for n, u in update.items()}


OUT_OF_RANGE_PARAM = "blocks.0.attn.wq.weight"  # 10x10 chunks: universe 100, k 8, L 3 → 103 is encodable


def hostile(codec, update, hp, uid: int, window: int) -> dict[str, bytes]:
    """name → crafted payload bytes; the name is the Reason value the validator must report."""
    import numpy as np

    good = honest(codec, update, hp, uid, window)
    entries, md = split(good)
    n = hp.sync_samples
    out: dict[str, bytes] = {}
    out["malformed"] = b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}" + b"\0" * 64
    out["too_large"] = good + b"\0" * (len(good) * 8 + 20000)

    missing = dict(entries)
    del missing["sync.values"]
    out["bad_keys"] = build(missing, md)

    as_f64 = dict(entries)
    as_f64["sync.values"] = ("F64", [n], np.zeros(n, dtype=np.float64).tobytes())
    out["bad_dtype"] = build(as_f64, md)

    longer = dict(entries)
    longer["sync.values"] = ("F32", [n + 1], np.zeros(n + 1, dtype=np.float32).tobytes())
    out["bad_shape"] = build(longer, md)

    oob = _copy(update)
    assert int(oob[OUT_OF_RANGE_PARAM].idx[0, -2]) < 103
    oob[OUT_OF_RANGE_PARAM].idx[0, -1] = 103
    out["index_out_of_range"] = encode_payload(codec, oob, torch.zeros(n), PayloadMeta(
        uid, window, hp.protocol_version, hp.digest()))

    # one extra upper bit set in chunk 0 of the first tensor's index stream: k+1 indices there
    name = next(iter(codec.plans))
    coder = codec.index_coder(name)
    bits = np.unpackbits(np.frombuffer(entries["demo.idx"][2], dtype=np.uint8), bitorder="little")
    upper = np.arange(coder.k * coder.low_bits, coder.bits_per_chunk)  # the first tensor comes first
    bits[upper[bits[upper] == 0][0]] = 1
    counted = dict(entries)
    counted["demo.idx"] = ("U8", entries["demo.idx"][1], np.packbits(bits, bitorder="little").tobytes())
    out["wrong_count"] = build(counted, md)

    levels = codec.quantiser.levels  # the first tensor's level table, descending: no encoder writes it
    table = np.frombuffer(entries["demo.scale"][2], dtype=np.float32).copy()
    table[:levels] = np.linspace(2.0, 1.0, levels, dtype=np.float32)
    swapped = dict(entries)
    swapped["demo.scale"] = ("F32", entries["demo.scale"][1], table.tobytes())
    out["bad_encoding"] = build(swapped, md)

    out["non_finite"] = honest(codec, update, hp, uid, window, sync=torch.full((n,), float("nan")))
    out["metadata_mismatch"] = honest(codec, update, hp, uid + 1, window)  # claims another uid
    return out


def metadata_variants(codec, update, hp, uid: int, window: int) -> dict[str, bytes]:
    """Each way the metadata can disagree with what the reader expects."""
    good = honest(codec, update, hp, uid, window)
    entries, md = split(good)
    out = {"uid": honest(codec, update, hp, uid + 1, window),
           "window": honest(codec, update, hp, uid, window + 1)}
    for key, value in (("protocol_version", str(hp.protocol_version + 1)), ("codec.topk", "4"),
                       ("hparams", "0" * 16), ("format", "other"), ("extra", "x")):
        changed = dict(md)
        changed[key] = value
        out[key] = build(entries, changed)
    dropped = dict(md)
    del dropped["window"]
    out["missing window"] = build(entries, dropped)
    return out

