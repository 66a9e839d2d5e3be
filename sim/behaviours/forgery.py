"""Forgeries: the LastModified a forging server claims, and a lying leader's forged payload (sim/validator.py)."""
from __future__ import annotations

import hashlib
import math

from dso.codec.codecs import Codec
from dso.protocol.payload import Payload
from dso.protocol.rejections import Rejection
from sim.behaviours.base import BACKDATE_BY
from sim.behaviours.updates import scaled
from storage.wire import Expect, decode_payload, encode_payload


def forged_time(true: float, opened: float | None, by: float = BACKDATE_BY) -> float:
    """The LastModified a forger's server claims for an object its real server stamped ``true`` (whole seconds):
    ``by`` seconds earlier, but not before the put window it was written for opened (at ``opened``): a claim
    before the open would only be ``too_early``, so the earliest second inside the window is the most a forgery
    can gain (and an object stamped in the window's first second keeps its stamp)."""
    if opened is None or true < math.floor(opened):  # written before this window opened
        return true - by
    return min(true, max(true - by, float(math.ceil(opened))))


LYING_LEADER = "lying_leader"  # when it leads: forges a payload, includes a rejected one, drops the best one
VALIDATOR_BEHAVIOURS = (LYING_LEADER,)


def forged_payload(codec: Codec, payload: Payload) -> Payload:
    """``payload`` with its update negated, under the same uid and the same signature, which no longer covers
    the bytes: what a leader that forges a miner's payload puts in its bundle."""
    meta = payload.meta
    data = encode_payload(codec, scaled(codec, meta.window, payload.update, -1.0), payload.sync_values, meta)
    forged = decode_payload(data, codec, Expect(meta.window, meta.protocol_version, meta.hparams_digest,
                                                int(payload.sync_values.numel())))
    if isinstance(forged, Rejection):
        raise ValueError(f"a negated payload does not decode: {forged}")
    forged.raw, forged.sha256, forged.signature = data, hashlib.sha256(data).hexdigest(), payload.signature
    return forged
