"""Miner behaviours: the honest protocol and the attacks the network must withstand (experiments only).

A behaviour changes three things of an honest miner: how much it trains, what
update it uploads (a transform of its own update, or something built from the
updates of others it can read during the put window), and when it uploads.
Everything is codec-generic: updates are decoded, changed in parameter space and
compressed again with the run's codec.  The production miner (neurons/miner.py)
knows none of this; sim/miner.py and sim/simulator.py apply these plans.

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
| gamer | trains only in windows where it expects to be evaluated, uploads zeros otherwise (issue 17) |
| noisycopy | re-uploads another miner's update with noise added (issue 17: a near-copy) |
| mixer | uploads the mean of two other miners' updates (issue 17) |
| scaledcopy | re-uploads another miner's update ×0.9 (issue 17) |
| replayer | uploads the previous window's public aggregate as its own update (issue 17) |
| backdater | a copier that serves a forged, earlier LastModified from its own S3 server (issue 17) |
| hider | uploads after the put window closed and serves a forged LastModified inside it (issue 17) |

A validator behaviour lives at the end (issue 37): ``lying_leader`` — when it leads, its bundle holds a forged
payload and a payload it rejected, and leaves out the best one (sim/validator.py).

The ``gamer`` needs foresight of the evaluation schedule.  In the simulator it gets the most a miner could
know (sim/foresight.py: the validator's whole state, everything but randomness that does not exist yet at
upload time); on the local network it guesses the old round-robin period (trains one window in
``GAMER_PERIOD``).
"""
from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import safetensors.numpy
import torch

from dso.codecs import Codec, Update
from dso.rejections import Rejection
from storage.tensorfile import load_arrays, read_header
from storage.wire import Expect, Payload, decode_payload, encode_payload

BEHAVIOURS = ("honest", "diligent", "freerider", "absent", "noise", "scaler", "signflip", "copier", "sybil",
              "desync", "late", "malformed", "alie", "ipm", "gamer", "noisycopy", "mixer", "scaledcopy", "replayer",
              "backdater", "hider")
COPIERS = ("copier", "noisycopy", "mixer", "scaledcopy", "backdater")  # build their update from others' uploads
GOOD = ("honest", "diligent")

ALIE_Z = 1.0        # std multiples subtracted by ALIE
IPM_EPSILON = 0.5   # scale of the negated mean
SCALE = 1000.0
LATE_BY = 1.1       # `late` uploads (commits, under commit-reveal) this long after the put window closed
# the hider, later still: past ⌊close⌋ + 1.25 s, where the validator's look at the close is certain.  An upload
# landing before that is seen by the look and judged by its LastModified, which a forger controls: the band a
# forged LastModified can hide in is at most 1.25 s past the close (docs/scoring.md, "Forgers on real processes").
# And before the gather at close + 1.5 s, so the upload is read (and judged late), not missed: 1.5 raced it once the
# look had become quicker (issue 37), and the hider was `missing` in most windows
HIDE_BY = 1.4
DESYNC_EVERY, DESYNC_LENGTH = 8, 3   # desync skips aggregates for 3 windows out of every 8
GAMER_PERIOD = 5     # without foresight, the gamer trains one window in 5 (30 peers, 6 evaluated per window)
GAMER_THRESHOLD = 0.5  # with foresight, it trains when its chance of being evaluated is at least this
COPY_NOISE = 0.3     # noisycopy: noise of this RMS relative to each tensor's RMS in the copied update
COPY_SCALE = 0.9     # scaledcopy's factor
BACKDATE_BY = 3.0    # backdater/hider: seconds its forged LastModified claims before the true time
FORGERS = ("backdater", "hider")  # publish their own S3 server, which serves LastModified up to BACKDATE_BY early


@dataclass(frozen=True)
class Plan:
    """What a behaviour does in one window."""

    train: bool = True             # compute the honest update on assigned data
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


def plan(behaviour: str, window: int) -> Plan:
    if behaviour not in BEHAVIOURS:
        raise ValueError(f"unknown behaviour {behaviour!r}; choose from {', '.join(BEHAVIOURS)}")
    if behaviour == "diligent":
        return Plan(data_batches=2)
    if behaviour == "absent":
        return Plan(train=False, upload=False)
    if behaviour in ("freerider", "noise", "malformed"):
        return Plan(train=False)
    if behaviour in COPIERS + ("alie", "ipm"):
        return Plan(train=False, reads_peers=True)
    if behaviour == "replayer":
        return Plan(train=False)
    if behaviour == "late":
        return Plan(late=True)
    if behaviour == "hider":
        return Plan(late=True, late_by=HIDE_BY)
    if behaviour == "desync":
        return Plan(apply_aggregate=window % DESYNC_EVERY >= DESYNC_LENGTH)
    if behaviour == "gamer":
        return gamer_plan(1.0 if window % GAMER_PERIOD == 0 else 0.0)
    return Plan()


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


def mix(codec: Codec, window: int, a: Update, b: Update) -> Update:
    """The mean of two updates, each normalised per tensor first (as the aggregation normalises them)."""
    da, db = codec.decompress(a), codec.decompress(b)
    out = {}
    for n in codec.shapes:
        na, nb = da[n].norm().clamp_min(1e-12), db[n].norm().clamp_min(1e-12)
        out[n] = 0.5 * (da[n] / na + db[n] / nb) * 0.5 * (na + nb)
    return codec.compress(out, window)


def replay(codec: Codec, window: int, previous: dict[str, torch.Tensor] | None) -> Update | None:
    """The previous window's aggregate Δ, compressed as the replayer's own update."""
    if previous is None:
        return None
    return codec.compress({n: previous[n].detach().float().cpu() for n in codec.shapes}, window)


def transform(behaviour: str, codec: Codec, own: Update | None, window: int, generator: torch.Generator,
              others: list[Update] | None = None, previous: dict[str, torch.Tensor] | None = None) -> Update | None:
    """The update this behaviour uploads (None = nothing to upload this window)."""
    others = others or []
    if behaviour in ("honest", "diligent", "late", "desync", "sybil", "hider"):
        return own
    if behaviour == "gamer":
        return zeros(codec, window) if own is None else own
    if behaviour == "freerider":
        return zeros(codec, window)
    if behaviour == "noise":
        return noise(codec, window, generator)
    if behaviour == "scaler":
        return None if own is None else scaled(codec, window, own, SCALE)
    if behaviour == "signflip":
        return None if own is None else scaled(codec, window, own, -1.0)
    if behaviour == "alie":
        return alie(codec, window, others)
    if behaviour == "ipm":
        return ipm(codec, window, others)
    if behaviour in ("copier", "backdater"):
        return others[0] if others else None
    if behaviour == "noisycopy":
        return noisy_copy(codec, window, others[0], generator) if others else None
    if behaviour == "scaledcopy":
        return scaled(codec, window, others[0], COPY_SCALE) if others else None
    if behaviour == "mixer":
        return mix(codec, window, others[0], others[1]) if len(others) >= 2 else None
    if behaviour == "replayer":
        return replay(codec, window, previous)
    if behaviour == "absent":
        return None
    raise ValueError(f"behaviour {behaviour!r} has no update transform")  # malformed works on bytes


def malformed_bytes(good: bytes, window: int) -> bytes:
    """A broken payload, rotating by window: garbage, out-of-range indices, NaN values, truncation."""
    kind = ("garbage", "bad_indices", "nan_values", "truncated")[window % 4]
    if kind == "garbage":
        return bytes((window * 7919 + i * 104729) % 256 for i in range(max(64, len(good) // 4)))
    if kind == "truncated":
        return good[: len(good) // 2]
    header, arrays = read_header(good, len(good)), load_arrays(good)
    for key, array in arrays.items():
        if kind == "bad_indices" and key.endswith(".idx"):
            array[:] = 0xFF  # every upper bit set: wrong count of indices in each chunk
        if kind == "nan_values" and (key.endswith(".scale") or key == "sync.values"):
            array[:] = np.nan
    return safetensors.numpy.save(arrays, metadata=header.metadata)


def sybil_exchange(group_dir: Path, uid: int, window: int, update_bytes: bytes | None, timeout: float) -> bytes | None:
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
    deadline = time.time() + timeout
    while not shared.exists():
        if time.time() > deadline:
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
