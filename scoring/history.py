"""Replays: an update sent again in a later window — a peer's own earlier upload, another peer's, or an earlier
aggregate — and updates that hold nothing at all.

Every window the validator keeps a sketch of each update it read and of the aggregate a replayer would send (the
previous window's, compressed by the run's codec) for ``HISTORY_WINDOWS`` windows.  An update whose sketch is
within ``REPLAY_COSINE`` of one of an earlier window is a replay: it took no work in this window, whatever its
LossScore.  Near-copies within one window are scoring/copies.py's business; this module looks back in time only.

The sketch is a count sketch of the normalised decoded row (``dso.aggregation.robust.decoded_rows``): each coordinate
is added,
with a sign, into one of ``SKETCH_DIM`` buckets chosen by a hash of its index, so inner products — and cosines —
are kept up to an error of about 1/√SKETCH_DIM (0.016) while a window's history of a 4 M-parameter model costs
16 KB per update instead of 17 MB.  The hash is fixed, so every validator sketches alike and a restart keeps the
meaning of a saved history.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from dso.protocol.rejections import Reason, Rejection

SKETCH_DIM = 4096
HISTORY_WINDOWS = 32      # how far back a replay is recognised (older updates were computed at a far θ)
REPLAY_COSINE = 0.9       # as the near-copy pair test: honest updates of one peer in two windows stay far below
AGGREGATE = -1            # the label of an aggregate in the history (uids are ≥ 0)
_SEED = 0x5EED_0DD5


def _hashes(n: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(bucket, sign) of coordinates 0..n−1: a fixed pseudo-random map (splitmix-style mixing of the index)."""
    x = torch.arange(n, dtype=torch.int64) * 0x9E3779B1 + _SEED
    x = (x ^ (x >> 15)) * 0x2C1B3C6D & 0xFFFFFFFF
    x = (x ^ (x >> 12)) * 0x297A2D39 & 0xFFFFFFFF
    x = x ^ (x >> 15)
    return x % dim, ((x >> 20) & 1).to(torch.float32) * 2 - 1


@dataclass
class Sketcher:
    """Count sketches of rows of one length."""

    length: int
    dim: int = SKETCH_DIM
    buckets: torch.Tensor = field(init=False, repr=False)
    signs: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.buckets, self.signs = _hashes(self.length, self.dim)

    def sketch(self, row: torch.Tensor) -> torch.Tensor:
        """The count sketch of ``row`` (float32, shape (dim,)); non-finite values count as 0."""
        values = torch.nan_to_num(row.detach().to("cpu", torch.float32).reshape(-1), nan=0.0, posinf=0.0,
                                  neginf=0.0)
        if values.numel() != self.length:
            raise ValueError(f"row of {values.numel()} values, the sketcher's rows have {self.length}")
        return torch.zeros(self.dim).index_add_(0, self.buckets, values * self.signs)


@dataclass(frozen=True)
class Entry:
    window: int
    label: int          # the uid whose update it was, or AGGREGATE
    sketch: torch.Tensor


@dataclass
class UploadHistory:
    """The sketches of the last ``windows`` windows' updates and aggregates, oldest first."""

    windows: int = HISTORY_WINDOWS
    entries: list[Entry] = field(default_factory=list)
    _sketchers: dict[int, Sketcher] = field(default_factory=dict, repr=False, compare=False)

    def __deepcopy__(self, memo: dict[int, object]) -> UploadHistory:
        """A copy that shares the sketches (never changed in place) and the sketchers (fixed tables): the validator
        state is deep-copied every window for its all-or-nothing update."""
        return UploadHistory(self.windows, list(self.entries), self._sketchers)

    def sketcher(self, length: int) -> Sketcher:
        """The sketcher of rows of ``length`` values (built once: its hash table is as long as the model)."""
        if length not in self._sketchers:
            self._sketchers[length] = Sketcher(length)
        return self._sketchers[length]

    def add(self, window: int, label: int, sketch: torch.Tensor) -> None:
        self.entries.append(Entry(window, label, sketch))
        self.entries = [e for e in self.entries if e.window > window - self.windows]

    def closest(self, sketch: torch.Tensor, before: int) -> tuple[Entry, float] | None:
        """The entry of a window before ``before`` most alike ``sketch`` (cosine), or None when there is none or
        ``sketch`` is zero."""
        earlier = [e for e in self.entries if e.window < before]
        norm = float(sketch.norm())
        if not earlier or not norm > 0:
            return None
        stack = torch.stack([e.sketch for e in earlier])
        norms = stack.norm(dim=1).clamp_min(1e-30)
        cos = (stack @ sketch) / (norms * norm)
        best = int(cos.argmax())
        return earlier[best], float(cos[best])


    def to_tensors(self) -> dict[str, torch.Tensor]:
        """The history as two tensors: ``index`` (window, label) per entry and ``sketches``."""
        if not self.entries:
            return {"index": torch.zeros((0, 2), dtype=torch.int64), "sketches": torch.zeros((0, SKETCH_DIM))}
        return {"index": torch.tensor([[e.window, e.label] for e in self.entries], dtype=torch.int64),
                "sketches": torch.stack([e.sketch for e in self.entries])}

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, torch.Tensor], windows: int = HISTORY_WINDOWS) -> UploadHistory:
        """The history :meth:`to_tensors` wrote; raises ValueError for anything else."""
        if set(tensors) != {"index", "sketches"}:
            raise ValueError(f"history: expected the tensors index and sketches, got {sorted(tensors)[:4]}")
        index, sketches = tensors["index"], tensors["sketches"]
        if index.dtype != torch.int64 or index.ndim != 2 or index.shape[1] != 2:
            raise ValueError("history: index must be int64 of shape (n, 2)")
        if sketches.dtype != torch.float32 or tuple(sketches.shape) != (index.shape[0], SKETCH_DIM):
            raise ValueError(f"history: sketches must be float32 of shape ({index.shape[0]}, {SKETCH_DIM})")
        if not bool(torch.isfinite(sketches).all()) or (index.numel() and int(index[:, 1].min()) < AGGREGATE):
            raise ValueError("history: a sketch is not finite or a label is not a uid")
        return cls(windows, [Entry(int(w), int(label), sketch.clone())
                             for (w, label), sketch in zip(index.tolist(), sketches, strict=True)])


def is_empty(row: torch.Tensor) -> bool:
    """An update that holds nothing: every value zero (or not a number)."""
    return not bool(torch.nan_to_num(row, nan=0.0, posinf=0.0, neginf=0.0).abs().max() > 0) if row.numel() else True


def find_replays(history: UploadHistory, window: int, rows: Mapping[int, torch.Tensor],
                 aggregate_row: torch.Tensor | None, skip: Sequence[int] = (),
                 threshold: float = REPLAY_COSINE) -> dict[int, Rejection]:
    """Rejections of this window's updates (``rows``: uid → normalised decoded row) that hold nothing or replay an
    update of an earlier window; then the window's rows (and ``aggregate_row``: the previous aggregate as a replayer
    would send it) join the history.  Peers in ``skip`` (already rejected this window) are not judged again."""
    if not rows:
        return {}
    sketcher = history.sketcher(next(iter(rows.values())).numel())
    sketches = {uid: sketcher.sketch(row) for uid, row in sorted(rows.items())}
    out: dict[int, Rejection] = {}
    for uid, row in sorted(rows.items()):
        if uid in skip:
            continue
        if is_empty(row):
            out[uid] = Rejection(Reason.EMPTY, "the update holds no value: no work")
            continue
        found = history.closest(sketches[uid], window)
        if found is not None and found[1] >= threshold:
            entry, cosine = found
            what = "an aggregate" if entry.label == AGGREGATE else f"uid {entry.label}'s update"
            out[uid] = Rejection(Reason.REPLAY, f"{what} of window {entry.window} sent again (cosine {cosine:.3f})")
    for uid, sketch in sketches.items():
        if not math.isclose(float(sketch.norm()), 0.0):
            history.add(window, uid, sketch)
    if aggregate_row is not None and not is_empty(aggregate_row):
        history.add(window - 1, AGGREGATE, sketcher.sketch(aggregate_row))
    return out
