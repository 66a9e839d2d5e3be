"""Miner behaviours: the honest protocol and the attacks the network must withstand (experiments only).

A behaviour is a class: it decides how much a miner trains and on what data (:meth:`Behaviour.plan`,
:meth:`Behaviour.training_data`), what it uploads (:meth:`Behaviour.upload`: its own update, a transform of it, or
something built from the updates of others it can read in the put window, the public aggregates and its own
history), how many sequences it declares it trained on (:meth:`Behaviour.declared`), and when it uploads.  One
instance per miner keeps what that miner remembers between windows.  Everything is codec-generic: updates are
decoded, changed in parameter space and compressed again with the run's codec.  The production miner
(neurons/miner.py) knows none of this; sim/miner.py (real processes) and sim/simulator.py (one process) apply them.

| name | what it does |
|---|---|
| honest | trains on its assigned data, uploads at the put window |
| diligent | trains on twice the baseline amount of its assigned data |
| freerider | uploads an all-zero update |
| absent | uploads nothing |
| noise | uploads random values |
| scaler | uploads its honest update ×1000 |
| signflip | uploads its honest update negated |
| copier | waits for another miner's upload in the put window and re-uploads it as its own |
| sybil | two uids upload the same update (one trains, both upload) |
| desync | stops applying aggregates for a few windows, then catches up |
| late | uploads after the put window closes |
| malformed | garbage bytes, out-of-range indices, NaN values (rotating by window) |
| alie | "a little is enough": mean − z·std of the honest updates it can read |
| ipm | inner-product manipulation: −ε · mean of the honest updates it can read |
| gamer | trains only in windows where it expects to be evaluated, uploads zeros otherwise |
| noisycopy | re-uploads another miner's update with noise added (a near-copy) |
| mixer | uploads the mean of two other miners' updates |
| mixall | uploads the mean of every other miner's update |
| noisymix | mixall with noise added |
| scaledmix | mixall scaled by 0.5 |
| scaledcopy | re-uploads another miner's update ×0.9 |
| replayer | uploads the previous window's public aggregate as its own update |
| oldreplayer | uploads the public aggregate of ``REPLAY_LAG`` windows ago |
| selfreplay | trains once, in its first window, and uploads that update again every window |
| stalecopy | uploads another miner's update of ``REPLAY_LAG`` windows ago |
| parttime2, parttime3, parttime5 | trains one window in k, replays its last trained update otherwise |
| parttime2z | trains one window in 2, uploads zeros otherwise |
| wrongdata | the honest compute, on sequences other than its assignment |
| fixedbatch | the honest compute, every step on one fixed batch |
| othertext | the honest compute, on another text (its assignment read backwards) |
| backdater | a copier that serves a forged, earlier LastModified from its own S3 server |
| hider | uploads after the put window closed and serves a forged LastModified inside it |

Every behaviour that does not train declares the sequences an honest miner would (it wants to be paid for them).

A validator behaviour lives at the end, against the leader nobody has to trust: ``lying_leader`` — when it leads,
its bundle holds a forged payload and a payload it rejected, and leaves out the best one (sim/validator.py).

The ``gamer`` needs foresight of the evaluation schedule.  In the simulator it gets the most a miner could
know (sim/foresight.py: the validator's whole state, everything but randomness that does not exist yet at
upload time); on the local network it guesses the old round-robin period (trains one window in
``GAMER_PERIOD``).
"""
from __future__ import annotations

import hashlib
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import safetensors.numpy
import torch

from dso.codecs import Codec, Update
from dso.payload import Payload
from dso.rejections import Rejection
from storage.tensorfile import load_arrays, read_header
from storage.wire import Expect, decode_payload, encode_payload

if TYPE_CHECKING:
    from dso.data import Dataset

ALIE_Z = 1.0        # std multiples subtracted by ALIE
IPM_EPSILON = 0.5   # scale of the negated mean
SCALE = 1000.0
LATE_BY = 1.1       # `late` uploads (commits, under commit-reveal) this long after the put window closed
# the hider, later still: past ⌊close⌋ + 1.25 s, where the validator's look at the close is certain.  An upload
# landing before that is seen by the look and judged by its LastModified, which a forger controls: the band a
# forged LastModified can hide in is at most 1.25 s past the close (docs/scoring.md, "Forgers on real processes").
# And before the gather at close + 1.5 s, so the upload is read (and judged late), not missed: 1.5 raced it once the
# look had become quicker (it watches for signature objects), and the hider was `missing` in most windows
HIDE_BY = 1.4
DESYNC_EVERY, DESYNC_LENGTH = 8, 3   # desync skips aggregates for 3 windows out of every 8
GAMER_PERIOD = 5     # without foresight, the gamer trains one window in 5 (30 peers, 6 evaluated per window)
GAMER_THRESHOLD = 0.5  # with foresight, it trains when its chance of being evaluated is at least this
COPY_NOISE = 0.3     # noisycopy / noisymix: noise of this RMS relative to each tensor's RMS in the copied update
COPY_SCALE = 0.9     # scaledcopy's factor
MIX_SCALE = 0.5      # scaledmix's factor
REPLAY_LAG = 4       # oldreplayer / stalecopy: windows back
OTHER_DATA_UID = 1 << 20  # wrongdata trains on the assignment of this uid + its own (no miner has it)
FIXED_BATCH = 8      # fixedbatch: the sequences it trains on in every step
BACKDATE_BY = 3.0    # backdater/hider: seconds its forged LastModified claims before the true time


@dataclass(frozen=True)
class Plan:
    """What a behaviour does in one window."""

    train: bool = True             # compute an update by the honest inner loop (on training_data)
    data_batches: int = 1          # batches of assigned size to train on
    upload: bool = True
    reads_peers: bool = False      # builds its update from others' uploads (copier, alie, ipm)
    late: bool = False             # upload after the put window closed ...
    late_by: float = LATE_BY       # ... by this many seconds
    apply_aggregate: bool = True

    @property
    def self_aggregate(self) -> bool:
        """Trainers gather the top-G updates and aggregate them themselves (as the protocol asks); the
        others only need θ for their sync samples and replay the leader's published aggregate instead."""
        return self.train


@dataclass
class Inputs:
    """What a behaviour can build its upload of one window from."""

    codec: Codec
    window: int
    own: Update | None                     # what it trained this window (None: it did not train)
    generator: torch.Generator
    others: list[Update] = field(default_factory=list)  # other miners' updates it read in the put window
    previous: dict[str, torch.Tensor] | None = None     # the previous window's aggregate Δ (public)


class Behaviour:
    """The honest protocol; attacks override what they change."""

    name: ClassVar[str] = "honest"
    good: ClassVar[bool] = False       # does the honest work (honest, diligent)
    reads_peers: ClassVar[bool] = False
    peers_wanted: ClassVar[int] = 1    # a peer reader waits for this many others' uploads before it builds on them
    forges: ClassVar[bool] = False     # serves its bucket through a server that forges LastModified
    needs_previous: ClassVar[bool] = False  # reads the previous window's public aggregate

    def plan(self, window: int) -> Plan:
        return Plan(train=not self.reads_peers, reads_peers=self.reads_peers)

    def training_data(self, dataset: Dataset, uid: int, window: int, assigned: int) -> torch.Tensor:
        """The sequences it trains on, in order (honest: its assignment)."""
        return dataset.assigned(uid, window, assigned)

    def upload(self, inputs: Inputs) -> Update | None:
        """The update it uploads (None = nothing to upload this window)."""
        return inputs.own

    def declared(self, trained: int, honest: int) -> int:
        """The sequences it declares in its payload: what it trained on, or an honest miner's count when it
        trained on none (it wants the pay)."""
        return trained if trained else honest

    def wire(self, data: bytes, window: int) -> bytes:
        """The bytes it puts in its bucket (honest: its encoded payload)."""
        return data


class Honest(Behaviour):
    good = True


class Diligent(Behaviour):
    name, good = "diligent", True

    def plan(self, window: int) -> Plan:
        return Plan(data_batches=2)


class Freerider(Behaviour):
    name = "freerider"

    def plan(self, window: int) -> Plan:
        return Plan(train=False)

    def upload(self, inputs: Inputs) -> Update | None:
        return zeros(inputs.codec, inputs.window)


class Absent(Behaviour):
    name = "absent"

    def plan(self, window: int) -> Plan:
        return Plan(train=False, upload=False)

    def upload(self, inputs: Inputs) -> Update | None:
        return None


class Noise(Freerider):
    name = "noise"

    def upload(self, inputs: Inputs) -> Update | None:
        return noise(inputs.codec, inputs.window, inputs.generator)


class Malformed(Freerider):
    name = "malformed"

    def wire(self, data: bytes, window: int) -> bytes:
        return malformed_bytes(data, window)


class Scaler(Behaviour):
    name = "scaler"
    factor: ClassVar[float] = SCALE

    def upload(self, inputs: Inputs) -> Update | None:
        return None if inputs.own is None else scaled(inputs.codec, inputs.window, inputs.own, self.factor)


class Signflip(Scaler):
    name, factor = "signflip", -1.0


class Late(Behaviour):
    name = "late"

    def plan(self, window: int) -> Plan:
        return Plan(late=True)


class Hider(Behaviour):
    name, forges = "hider", True

    def plan(self, window: int) -> Plan:
        return Plan(late=True, late_by=HIDE_BY)


class Desync(Behaviour):
    name = "desync"

    def plan(self, window: int) -> Plan:
        return Plan(apply_aggregate=window % DESYNC_EVERY >= DESYNC_LENGTH)


class Sybil(Behaviour):
    """Both uids of a pair upload the update one of them trained (the transport shares it: sybil_exchange)."""

    name = "sybil"


class Gamer(Behaviour):
    """Trains when it expects evaluation; uploads zeros otherwise (they pass SyncScore: it follows the network)."""

    name = "gamer"

    def plan(self, window: int) -> Plan:
        return gamer_plan(1.0 if window % GAMER_PERIOD == 0 else 0.0)

    def upload(self, inputs: Inputs) -> Update | None:
        return zeros(inputs.codec, inputs.window) if inputs.own is None else inputs.own


class Copier(Behaviour):
    name, reads_peers = "copier", True

    def upload(self, inputs: Inputs) -> Update | None:
        return inputs.others[0] if inputs.others else None


class Backdater(Copier):
    name, forges = "backdater", True


class NoisyCopy(Copier):
    name = "noisycopy"

    def upload(self, inputs: Inputs) -> Update | None:
        return noisy_copy(inputs.codec, inputs.window, inputs.others[0], inputs.generator) if inputs.others else None


class ScaledCopy(Copier):
    name = "scaledcopy"

    def upload(self, inputs: Inputs) -> Update | None:
        return scaled(inputs.codec, inputs.window, inputs.others[0], COPY_SCALE) if inputs.others else None


class Mixer(Copier):
    name, peers_wanted = "mixer", 2

    def upload(self, inputs: Inputs) -> Update | None:
        return mix(inputs.codec, inputs.window, inputs.others[:2]) if len(inputs.others) >= 2 else None


class MixAll(Copier):
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


class Alie(Copier):
    name, peers_wanted = "alie", 2

    def upload(self, inputs: Inputs) -> Update | None:
        return alie(inputs.codec, inputs.window, inputs.others)


class Ipm(Copier):
    name = "ipm"

    def upload(self, inputs: Inputs) -> Update | None:
        return ipm(inputs.codec, inputs.window, inputs.others)


class Replayer(Freerider):
    """Uploads the public aggregate of ``lag`` windows ago as its own update."""

    name, needs_previous = "replayer", True
    lag: ClassVar[int] = 1

    def __init__(self) -> None:
        self.aggregates: deque[dict[str, torch.Tensor] | None] = deque(maxlen=self.lag)

    def upload(self, inputs: Inputs) -> Update | None:
        self.aggregates.append(inputs.previous)
        old = self.aggregates[0] if len(self.aggregates) == self.lag else None
        return replay(inputs.codec, inputs.window, old)


class OldReplayer(Replayer):
    name, lag = "oldreplayer", REPLAY_LAG


class StaleCopy(Copier):
    """Uploads another miner's update of ``REPLAY_LAG`` windows ago."""

    name = "stalecopy"

    def __init__(self) -> None:
        self.seen: deque[Update | None] = deque(maxlen=REPLAY_LAG + 1)

    def upload(self, inputs: Inputs) -> Update | None:
        self.seen.append(inputs.others[0] if inputs.others else None)
        return self.seen[0] if len(self.seen) == self.seen.maxlen else None


class SelfReplay(Behaviour):
    """Trains once, in its first window, then uploads that update again in every window."""

    name = "selfreplay"

    def __init__(self) -> None:
        self.first: Update | None = None

    def plan(self, window: int) -> Plan:
        return Plan(train=self.first is None)

    def upload(self, inputs: Inputs) -> Update | None:
        if self.first is None:
            self.first = inputs.own
        return self.first


class PartTime(Behaviour):
    """Trains one window in ``every``; in the others it replays its last trained update (or uploads zeros)."""

    name, every, zeros_between = "parttime2", 2, False

    def __init__(self) -> None:
        self.last: Update | None = None

    def plan(self, window: int) -> Plan:
        return Plan(train=window % self.every == 0)

    def upload(self, inputs: Inputs) -> Update | None:
        if inputs.own is not None:
            self.last = inputs.own
            return inputs.own
        return zeros(inputs.codec, inputs.window) if self.zeros_between else self.last


class PartTime3(PartTime):
    name, every = "parttime3", 3


class PartTime5(PartTime):
    name, every = "parttime5", 5


class PartTime2Zeros(PartTime):
    name, zeros_between = "parttime2z", True


class WrongData(Behaviour):
    """The honest compute on sequences that are not its assignment (another uid's, which no miner has)."""

    name = "wrongdata"

    def training_data(self, dataset: Dataset, uid: int, window: int, assigned: int) -> torch.Tensor:
        return dataset.assigned(OTHER_DATA_UID + uid, window, assigned)


class FixedBatch(Behaviour):
    """The honest compute with every inner step on one fixed batch of sequences that were never its assignment."""

    name = "fixedbatch"

    def training_data(self, dataset: Dataset, uid: int, window: int, assigned: int) -> torch.Tensor:
        batch = dataset.assigned(OTHER_DATA_UID + uid, 0, assigned)[:FIXED_BATCH]
        return batch.repeat(math.ceil(assigned / FIXED_BATCH), 1)[:assigned]


class OtherText(Behaviour):
    """The honest compute on another text: CPython's documentation prose (``dso.corpus.stdlib_prose``), cut into
    sequences by the run's tokeniser, a fresh stretch every window."""

    name = "othertext"

    def __init__(self) -> None:
        self.ids: np.ndarray | None = None

    def training_data(self, dataset: Dataset, uid: int, window: int, assigned: int) -> torch.Tensor:
        if self.ids is None:
            from dso.corpus import stdlib_prose
            self.ids = dataset.tokenizer.encode_long(stdlib_prose().read_text(errors="replace")).astype(np.int64)
        width = dataset.seq_len + 1
        rows = self.ids[: self.ids.size // width * width].reshape(-1, width)
        pick = np.random.default_rng([uid, window]).permutation(rows.shape[0])[:assigned]
        return torch.from_numpy(rows[np.resize(pick, assigned)])


_CLASSES: tuple[type[Behaviour], ...] = (
    Honest, Diligent, Freerider, Absent, Noise, Scaler, Signflip, Copier, Sybil, Desync, Late, Malformed, Alie, Ipm,
    Gamer, NoisyCopy, Mixer, MixAll, NoisyMix, ScaledMix, ScaledCopy, Replayer, OldReplayer, SelfReplay, StaleCopy,
    PartTime, PartTime3, PartTime5, PartTime2Zeros, WrongData, FixedBatch, OtherText, Backdater, Hider)
REGISTRY: dict[str, type[Behaviour]] = {cls.name: cls for cls in _CLASSES}
BEHAVIOURS = tuple(REGISTRY)
GOOD = tuple(name for name, cls in REGISTRY.items() if cls.good)
FORGERS = tuple(name for name, cls in REGISTRY.items() if cls.forges)


def make(name: str) -> Behaviour:
    """A fresh behaviour for one miner; an unknown name is refused with the known ones."""
    if name not in REGISTRY:
        raise ValueError(f"unknown behaviour {name!r}; choose from {', '.join(BEHAVIOURS)}")
    return REGISTRY[name]()


# ------------------------------------------------------------------ pieces
def forged_time(true: float, opened: float | None, by: float = BACKDATE_BY) -> float:
    """The LastModified a forger's server claims for an object its real server stamped ``true`` (whole seconds):
    ``by`` seconds earlier, but not before the put window it was written for opened (at ``opened``): a claim
    before the open would only be ``too_early``, so the earliest second inside the window is the most a forgery
    can gain (and an object stamped in the window's first second keeps its stamp)."""
    if opened is None or true < math.floor(opened):  # written before this window opened
        return true - by
    return min(true, max(true - by, float(math.ceil(opened))))


def gamer_plan(evaluation_chance: float, threshold: float = GAMER_THRESHOLD) -> Plan:
    """The gamer trains only when it expects evaluation; it still follows the network (its zeros must pass
    SyncScore)."""
    return Plan(train=evaluation_chance >= threshold)


def zeros(codec: Codec, window: int) -> Update:
    return codec.compress({n: torch.zeros(s) for n, s in codec.shapes.items()}, window)


def noise(codec: Codec, window: int, generator: torch.Generator, scale: float = 1e-3) -> Update:
    return codec.compress({n: scale * torch.randn(s, generator=generator) for n, s in codec.shapes.items()}, window)


def scaled(codec: Codec, window: int, update: Update, factor: float) -> Update:
    return codec.compress({n: factor * t for n, t in codec.decompress(update).items()}, window)


def alie(codec: Codec, window: int, others: list[Update], z: float = ALIE_Z) -> Update | None:
    """μ − z·σ per coordinate of the readable honest updates (needs at least two)."""
    if len(others) < 2:
        return None
    dense = [codec.decompress(u) for u in others]
    out = {}
    for n in codec.shapes:
        stack = torch.stack([d[n] for d in dense])
        out[n] = stack.mean(0) - z * stack.std(0)
    return codec.compress(out, window)


def ipm(codec: Codec, window: int, others: list[Update], epsilon: float = IPM_EPSILON) -> Update | None:
    if not others:
        return None
    dense = [codec.decompress(u) for u in others]
    return codec.compress({n: -epsilon * torch.stack([d[n] for d in dense]).mean(0) for n in codec.shapes}, window)


def noisy_copy(codec: Codec, window: int, update: Update, generator: torch.Generator,
               relative: float = COPY_NOISE) -> Update:
    """``update`` plus Gaussian noise of ``relative`` × each tensor's RMS, compressed again."""
    out = {}
    for n, t in codec.decompress(update).items():
        rms = t.float().pow(2).mean().sqrt()
        out[n] = t + relative * rms * torch.randn(t.shape, generator=generator)
    return codec.compress(out, window)


def mix(codec: Codec, window: int, updates: list[Update]) -> Update:
    """The mean of ``updates``, each normalised per tensor first (as the aggregation normalises them), at their mean
    norm, compressed again."""
    dense = [codec.decompress(u) for u in updates]
    out = {}
    for n in codec.shapes:
        norms = [d[n].norm().clamp_min(1e-12) for d in dense]
        out[n] = sum(d[n] / norm for d, norm in zip(dense, norms, strict=True)) / len(dense) * (sum(norms) / len(norms))
    return codec.compress(out, window)


def replay(codec: Codec, window: int, previous: dict[str, torch.Tensor] | None) -> Update | None:
    """An aggregate Δ, compressed as the replayer's own update."""
    if previous is None:
        return None
    return codec.compress({n: previous[n].detach().float().cpu() for n in codec.shapes}, window)


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


def sybil_exchange(group_dir: Path, uid: int, window: int, update_bytes: bytes | None, timeout: float,
                   clock: Callable[[], float] = time.time) -> bytes | None:
    """Sybils share one update through a directory: the lowest uid of the group trains and writes it, the
    others wait for it (until ``timeout`` seconds from now) and upload those bytes under their own uid."""
    group_dir.mkdir(parents=True, exist_ok=True)
    (group_dir / f"member-{uid}").touch()
    leader = min(int(p.name.split("-")[1]) for p in group_dir.glob("member-*"))
    shared = group_dir / f"window-{window}.bin"
    if uid == leader:
        if update_bytes is not None:
            tmp = shared.with_suffix(".tmp")
            tmp.write_bytes(update_bytes)
            tmp.replace(shared)
        return update_bytes
    deadline = clock() + timeout
    while not shared.exists():
        if clock() > deadline:
            return None
        time.sleep(0.05)
    return shared.read_bytes()


# ------------------------------------------------------------------ a lying leader (validators: sim/validator.py)
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
