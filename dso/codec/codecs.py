"""The update codec seam: what every codec offers, and the run's choice of codec.

A codec turns a peer's dense update into what goes on the wire and back.  The
window is always passed explicitly where it matters (compressing, reading the
wire): the sketch codec's projection changes every window, DeMo's does not, and
no codec keeps a hidden "current window" that callers must remember to set.
Updates are opaque to callers: only the codec that made one reads it.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

if TYPE_CHECKING:
    from dso.config.schema import HParams

Shapes = dict[str, tuple[int, ...]]
Update = Any          # one codec's compressed update (parameter name → per-tensor record)
WireSpec = dict[str, tuple[str, tuple[int, ...]]]  # key → (numpy dtype name, shape)


@dataclass(frozen=True)
class NearCopyThresholds:
    """Where a near-copy starts (scoring/copies.py; docs/scoring.md and decision 0017 have the measured honest
    distribution behind each).  A codec says which it needs (:meth:`Codec.near_copy_thresholds`)."""

    pair: float = 0.9       # cosine of two peers' normalised rows
    mix_r2: float = 0.5     # a positive combination of 2–3 nearest rows explains this much: worth the next test
    mix: float = 0.9        # cosine to the codec's compression of that combination
    mix_margin: float = 0.15  # ... and this far above the median row tested (windows where all are alike)
    mix_cap: float = 0.9    # ... a relative bar capped here (paper mode's *mix*)
    previous: float = 0.8   # cosine to the previous window's aggregate
    nearest: int = 3        # candidates for a mix: this many nearest peers (+ the previous aggregate)


DEFAULT_THRESHOLDS = NearCopyThresholds()  # one gradient per window (paper mode), where they were measured


class TensorCodec(Protocol):
    """What error feedback needs of a codec: one parameter's update out and back (every :class:`Codec` is
    one, and so is the simulator's uncompressed baseline)."""
    shapes: Shapes

    def compress_tensor(self, name: str, x: torch.Tensor, window: int, uid: int = 0) -> Any:
        """One parameter's update for ``window`` (``uid`` seeds any per-sender randomness)."""

    def to_dense(self, name: str, u: Any, device: str | torch.device = "cpu") -> torch.Tensor:
        """One parameter's record decoded to the parameter's shape."""


class Codec(TensorCodec, Protocol):
    def settings(self) -> dict[str, str]:
        """What a receiver must agree on to read an update (goes into payload metadata)."""

    def compress(self, tensors: Mapping[str, torch.Tensor], window: int, uid: int = 0) -> Update:
        """Every parameter's update for ``window``."""

    def values(self, u: Any) -> torch.Tensor:
        """The float values one per-tensor record carries."""

    def normalised_values(self, u: Any) -> torch.Tensor | None:
        """Those values scaled to unit L2 norm; None when they carry no direction."""

    def decompress(self, update: Update, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        """Every parameter decoded."""

    def mean_delta(self, updates: list[Update], device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        """Decoded mean of per-tensor L2-normalised updates (the Gauntlet aggregate, before the sign)."""

    def wire_spec(self) -> WireSpec:
        """Exact tensor set of an encoded update."""

    def to_wire(self, update: Update) -> dict[str, np.ndarray]:
        """The tensors that go on the wire."""

    def from_wire(self, tensors: dict[str, np.ndarray], window: int) -> Update:
        """Inverse of :meth:`to_wire` for tensors matching :meth:`wire_spec`; raises PackingError."""

    def kept(self) -> int:
        """Values sent per update."""

    def payload_bytes(self) -> int:
        """Bytes of an encoded update without container overhead."""

    def near_copy_thresholds(self, inner_steps: bool) -> NearCopyThresholds | None:
        """Where this codec's updates count as near-copies, for updates of several inner steps (``inner_steps``)
        or of one gradient; None: its updates are compared for exact copies only."""


def make_codec(shapes: Shapes, hp: HParams) -> Codec:
    """The run's codec: DeMo or the sketch, as ``hp.codec`` says."""
    if hp.codec == "sketch":
        from dso.codec.sketch import SketchCodec
        return SketchCodec.from_hparams(shapes, hp)
    from dso.codec.demo import DeMoCodec
    return DeMoCodec.from_hparams(shapes, hp)


def unit_vector(values: torch.Tensor) -> torch.Tensor | None:
    """``values`` scaled to unit L2 norm; None when they carry no direction (zero or non-finite norm)."""
    norm = torch.linalg.vector_norm(values)
    if not torch.isfinite(norm) or norm == 0:
        return None
    unit: torch.Tensor = values / norm
    return unit
