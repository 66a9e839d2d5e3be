"""The shape of a run's ``report.json`` (sim/report.py builds it, sim/report_html.py renders it).

A report read back from disk (``python -m sim.report``) is whatever the file holds: these types say what
:func:`sim.report.build` writes, and the renderers read the optional parts with ``.get``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from sim.agreement import Agreement


class ValPoint(TypedDict):
    window: int
    loss: float            # nats per token
    bits_per_byte: float   # NaN when the validator did not log it


class MinerFigures(TypedDict):
    """One miner's work, from its JSON lines (:func:`sim.report.miner_figures`)."""
    utilisation: float                # mean inner-training seconds ÷ window seconds, after its first window
    utilisation_all_windows: float    # the same over every window it logged
    tokens: int
    windows: int


class _PeerFigures(TypedDict):
    uid: int
    name: str
    behaviour: str
    weight: float                     # share of the last posted weights
    weight_mean: float                # mean of its per-window weights
    rejections: dict[str, int]        # reason → windows


class PeerRow(_PeerFigures, total=False):
    """A peer's row; the :class:`MinerFigures` keys too when the miner logged its work."""
    utilisation: float
    utilisation_all_windows: float
    tokens: int
    windows: int


class Summary(TypedDict):
    good_share: float
    max_adversary_share: float
    honest_mean: float
    diligent_mean: float | None
    val_loss_first: float | None
    val_loss_last: float | None
    val_bits_per_byte_first: float | None
    val_bits_per_byte_last: float | None
    tokens: int | None
    miner_utilisation_mean: float | None
    miner_utilisation_min: float | None
    miner_utilisation_mean_all_windows: float | None


class History(TypedDict):
    weights: list[dict[str, float]]   # per window: uid → weight
    ratings: list[dict[str, float]]   # per window: uid → LossRating
    windows: list[int]


class _ReportFigures(TypedDict):
    windows: int
    val_loss: list[ValPoint]
    peers: list[PeerRow]
    summary: Summary
    final_val_bits_per_byte: float | None
    unigram_bits_per_byte: float | None
    tokens: int | None
    miner_utilisation: dict[str, float]   # uid → utilisation, honest and diligent miners
    history: History


class Report(_ReportFigures, total=False):
    validators: Agreement                       # several validators: their agreement
    reference_adamw: dict[str, Any]             # sim/reference.py's curve (JSON), with its ``windows`` positions
    reference_final_bits_per_byte: float | None
    samples: Sequence[Mapping[str, Any]]        # {window, prompt, text, ...}: sim.sample.Sample as written
    data_source: str                            # where every node read the corpus
