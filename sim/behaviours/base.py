"""What every miner behaviour shares: its plan for a window, what it builds its upload from, the honest
defaults, and the constants that tune the attacks."""
from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch

from dso.codec.codecs import Codec, Update
from dso.protocol.rejections import Rejection

if TYPE_CHECKING:
    from dso.data.dataset import Dataset

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


Foresight = Callable[[], float]  # the miner's chance of being evaluated in the window, as far as it can foresee it


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
    copies_sync: ClassVar[bool] = False    # uploads the sync samples of the payload it copies with it
    shares_update: ClassVar[bool] = False  # every miner of this behaviour uploads the update the first one trained

    def plan(self, window: int, foresight: Foresight | None = None) -> Plan:
        """What it does in ``window``; ``foresight`` gives its chance of being evaluated there, for a behaviour
        that decides by it (the gamer; sim/foresight.py)."""
        return Plan(train=not self.reads_peers, reads_peers=self.reads_peers)

    def follows(self, window: int, behind: Collection[int] | None = None) -> bool:
        """Whether it applies the network's aggregate of ``window`` (``behind``: the windows a behaviour that falls
        behind does so in, instead of its own schedule; the others ignore it)."""
        return self.plan(window).apply_aggregate

    def simulated_rejection(self, window: int) -> Rejection | None:
        """The gatherer's rejection of what it uploads, for a behaviour whose bytes the simulator does not build
        (None: its payload decodes)."""
        return None

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
