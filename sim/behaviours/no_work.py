"""Behaviours that upload without training: zeros, nothing, noise, broken bytes."""
from __future__ import annotations

import numpy as np
import safetensors.numpy

from dso.codec.codecs import Update
from dso.protocol.rejections import Reason, Rejection
from sim.behaviours.base import Behaviour, Foresight, Inputs, Plan
from sim.behaviours.updates import noise, zeros
from storage.tensorfile import load_arrays, read_header

# what the gatherer rejects a malformed payload for, rotating by window (the simulator does not build its bytes)
MALFORMED = (Reason.MALFORMED, Reason.WRONG_COUNT, Reason.NON_FINITE, Reason.BAD_SHAPE)


class Freerider(Behaviour):
    name = "freerider"

    def plan(self, window: int, foresight: Foresight | None = None) -> Plan:
        return Plan(train=False)

    def upload(self, inputs: Inputs) -> Update | None:
        return zeros(inputs.codec, inputs.window)


class Absent(Behaviour):
    name = "absent"

    def plan(self, window: int, foresight: Foresight | None = None) -> Plan:
        return Plan(train=False, upload=False)

    def upload(self, inputs: Inputs) -> Update | None:
        return None


class Noise(Freerider):
    name = "noise"

    def upload(self, inputs: Inputs) -> Update | None:
        return noise(inputs.codec, inputs.window, inputs.generator)


class Malformed(Freerider):
    name = "malformed"

    def simulated_rejection(self, window: int) -> Rejection | None:
        return Rejection(MALFORMED[window % len(MALFORMED)], "simulated broken payload")

    def wire(self, data: bytes, window: int) -> bytes:
        return malformed_bytes(data, window)


def malformed_bytes(good: bytes, window: int) -> bytes:
    """A broken payload, rotating by window: garbage, out-of-range indices, NaN values, truncation."""
    kind = ("garbage", "bad_indices", "nan_values", "truncated")[window % 4]
    if kind == "garbage":
        return bytes((window * 7919 + i * 104729) % 256 for i in range(max(64, len(good) // 4)))
    if kind == "truncated":
        return good[: len(good) // 2]
    header, arrays = read_header(good, len(good)), load_arrays(good)
    if isinstance(header, Rejection) or isinstance(arrays, Rejection):
        raise ValueError("the honest payload to break does not decode")
    for key, array in arrays.items():
        if kind == "bad_indices" and key.endswith(".idx"):
            array[:] = 0xFF  # every upper bit set: wrong count of indices in each chunk
        if kind == "nan_values" and (key.endswith(".scale") or key == "sync.values"):
            array[:] = np.nan
    return safetensors.numpy.save(arrays, metadata=header.metadata)
