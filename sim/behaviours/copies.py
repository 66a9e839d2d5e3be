"""Behaviours that build their upload from other miners' updates read in the put window: copies (plain, noisy,
scaled, stale), mixes, and the ALIE and IPM attacks."""
from __future__ import annotations

from collections import deque

from dso.codec.codecs import Update
from sim.behaviours.base import COPY_SCALE, MIX_SCALE, REPLAY_LAG, Behaviour, Inputs
from sim.behaviours.updates import alie, ipm, mix, noisy_copy, scaled


class PeerReader(Behaviour):
    """Builds its upload from other miners' updates read in the put window (the base of this module's behaviours):
    the first one it read, unchanged."""

    reads_peers = True

    def upload(self, inputs: Inputs) -> Update | None:
        return inputs.others[0] if inputs.others else None


class Copier(PeerReader):
    """A careful copier: it copies the victim's sync samples as well."""

    name, copies_sync = "copier", True


class Backdater(PeerReader):
    name, forges = "backdater", True


class NoisyCopy(PeerReader):
    name = "noisycopy"

    def upload(self, inputs: Inputs) -> Update | None:
        return noisy_copy(inputs.codec, inputs.window, inputs.others[0], inputs.generator) if inputs.others else None


class ScaledCopy(PeerReader):
    name = "scaledcopy"

    def upload(self, inputs: Inputs) -> Update | None:
        return scaled(inputs.codec, inputs.window, inputs.others[0], COPY_SCALE) if inputs.others else None


class Mixer(PeerReader):
    name, peers_wanted = "mixer", 2

    def upload(self, inputs: Inputs) -> Update | None:
        return mix(inputs.codec, inputs.window, inputs.others[:2]) if len(inputs.others) >= 2 else None


class MixAll(PeerReader):
    name, peers_wanted = "mixall", 2

    def upload(self, inputs: Inputs) -> Update | None:
        return mix(inputs.codec, inputs.window, inputs.others) if len(inputs.others) >= 2 else None


class NoisyMix(MixAll):
    name = "noisymix"

    def upload(self, inputs: Inputs) -> Update | None:
        mixed = super().upload(inputs)
        return None if mixed is None else noisy_copy(inputs.codec, inputs.window, mixed, inputs.generator)


class ScaledMix(MixAll):
    name = "scaledmix"

    def upload(self, inputs: Inputs) -> Update | None:
        mixed = super().upload(inputs)
        return None if mixed is None else scaled(inputs.codec, inputs.window, mixed, MIX_SCALE)


class Alie(PeerReader):
    name, peers_wanted = "alie", 2

    def upload(self, inputs: Inputs) -> Update | None:
        return alie(inputs.codec, inputs.window, inputs.others)


class Ipm(PeerReader):
    name = "ipm"

    def upload(self, inputs: Inputs) -> Update | None:
        return ipm(inputs.codec, inputs.window, inputs.others)


class StaleCopy(PeerReader):
    """Uploads another miner's update of ``REPLAY_LAG`` windows ago."""

    name = "stalecopy"

    def __init__(self) -> None:
        self.seen: deque[Update | None] = deque(maxlen=REPLAY_LAG + 1)

    def upload(self, inputs: Inputs) -> Update | None:
        self.seen.append(inputs.others[0] if inputs.others else None)
        return self.seen[0] if len(self.seen) == self.seen.maxlen else None
