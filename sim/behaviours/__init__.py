"""Miner behaviours: the honest protocol and the attacks the network must withstand (experiments only).

A behaviour is a class: it decides how much a miner trains and on what data (:meth:`Behaviour.plan`,
:meth:`Behaviour.training_data`), what it uploads (:meth:`Behaviour.upload`: its own update, a transform of it, or
something built from the updates of others it can read in the put window, the public aggregates and its own
history), how many sequences it declares it trained on (:meth:`Behaviour.declared`), and when it uploads.  What the
simulator and the local network treat differently is asked of the class, never of its name: the plan given what it
can foresee of the evaluation schedule (``plan(window, foresight)``), whether it applies the network's aggregate
(:meth:`Behaviour.follows`), whether several uids upload one update (``shares_update``), copy the victim's sync
samples (``copies_sync``) or serve a forged LastModified (``forges``), and the gatherer's rejection of bytes the
simulator does not build (:meth:`Behaviour.simulated_rejection`); tests/unit/sim/test_behaviour_names.py fails on a
comparison of a behaviour's name outside this package.  One instance per miner keeps what that miner remembers
between windows.  Everything is codec-generic: updates are
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

The package holds one module per family (base, own_work, no_work, copies, replays, data) beside the updates they
build (updates) and the forgeries (forgery); this module is the registry and the names the rest of the code uses.
"""
from __future__ import annotations

from sim.behaviours.base import (
    ALIE_Z,
    BACKDATE_BY,
    COPY_NOISE,
    COPY_SCALE,
    DESYNC_EVERY,
    DESYNC_LENGTH,
    FIXED_BATCH,
    GAMER_PERIOD,
    GAMER_THRESHOLD,
    HIDE_BY,
    IPM_EPSILON,
    LATE_BY,
    MIX_SCALE,
    OTHER_DATA_UID,
    REPLAY_LAG,
    SCALE,
    Behaviour,
    Foresight,
    Inputs,
    Plan,
)
from sim.behaviours.copies import (
    Alie,
    Backdater,
    Copier,
    Ipm,
    MixAll,
    Mixer,
    NoisyCopy,
    NoisyMix,
    PeerReader,
    ScaledCopy,
    ScaledMix,
    StaleCopy,
)
from sim.behaviours.data import FixedBatch, OtherText, WrongData
from sim.behaviours.forgery import LYING_LEADER, VALIDATOR_BEHAVIOURS, forged_payload, forged_time
from sim.behaviours.no_work import MALFORMED, Absent, Freerider, Malformed, Noise, malformed_bytes
from sim.behaviours.own_work import (
    Desync,
    Diligent,
    Gamer,
    Hider,
    Honest,
    Late,
    Scaler,
    Signflip,
    Sybil,
    gamer_plan,
    sybil_exchange,
)
from sim.behaviours.replays import OldReplayer, PartTime, PartTime2Zeros, PartTime3, PartTime5, Replayer, SelfReplay
from sim.behaviours.updates import alie, ipm, mix, noise, noisy_copy, replay, scaled, zeros

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


__all__ = [
    "ALIE_Z", "BACKDATE_BY", "BEHAVIOURS", "COPY_NOISE", "COPY_SCALE", "DESYNC_EVERY", "DESYNC_LENGTH", "FIXED_BATCH",
    "FORGERS", "GAMER_PERIOD", "GAMER_THRESHOLD", "GOOD", "HIDE_BY", "IPM_EPSILON", "LATE_BY", "LYING_LEADER",
    "MALFORMED", "MIX_SCALE", "OTHER_DATA_UID", "REGISTRY", "REPLAY_LAG", "SCALE", "VALIDATOR_BEHAVIOURS",
    "Absent", "Alie", "Backdater", "Behaviour", "Copier", "Desync", "Diligent", "FixedBatch", "Foresight", "Freerider",
    "Gamer", "Hider", "Honest", "Inputs", "Ipm", "Late", "Malformed", "MixAll", "Mixer", "Noise", "NoisyCopy",
    "NoisyMix", "OldReplayer", "OtherText", "PartTime", "PartTime2Zeros", "PartTime3", "PartTime5", "PeerReader",
    "Plan", "Replayer", "Scaler", "ScaledCopy", "ScaledMix", "SelfReplay", "Signflip", "StaleCopy", "Sybil",
    "WrongData", "alie", "forged_payload", "forged_time", "gamer_plan", "ipm", "make", "malformed_bytes", "mix",
    "noise", "noisy_copy", "replay", "scaled", "sybil_exchange", "zeros",
]
