"""The update codec seam: what every codec offers, and the run's choice of codec.

A codec turns a peer's dense update into what goes on the wire and back.  The
window is always passed explicitly where it matters (compressing, reading the
wire): the sketch codec's projection changes every window, DeMo's does not, and
no codec keeps a hidden "current window" that callers must remember to set.
Updates are opaque to callers: only the codec that made one reads it.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

if TYPE_CHECKING:
    from dso.config import HParams

Shapes = dict[str, tuple[int, ...]]
Update = Any          # one codec's compressed update (parameter name → per-tensor record)
WireSpec = dict[str, tuple[str, tuple[int, ...]]]  # key → (numpy dtype name, shape)


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


def make_codec(shapes: Shapes, hp: HParams) -> Codec:
    """The run's codec: DeMo or the sketch, as ``hp.codec`` says."""
    if hp.codec == "sketch":
        from dso.sketch import SketchCodec
        return SketchCodec.from_hparams(shapes, hp)
    from dso.codec import DeMoCodec
    return DeMoCodec.from_hparams(shapes, hp)
