"""The help gate of the pay rule as a strategy object: does a peer's record say its updates help?

A peer's help record is its last ``help_memory`` help ratios (``formulas.help_ratio``: its LossScore over the
window's median, at most 1; −1 for an update that did no work), oldest first.  The gates differ only in how they
score that record (:meth:`HelpGate.record_score`); :func:`help_gate` picks the run's gate once, from
:data:`HELP_GATES` (name → class, ``hparams.help_rule``), and the pay rule calls its methods.

* :class:`BestOfTwo` — the better of the last two ratios (the DCT codec's profiles: its honest LossScores are
  noisier, so the gate cuts only on two low ratios in a row);
* :class:`MeanOfRecord` — the lower of the mean of the last two (no work counted 0) and the mean of the whole
  record (no work counted −1): a noise update needs a run of lucky draws (the default).

docs/scoring.md, "The help gate's rule", has the measurements behind both.
"""
from __future__ import annotations

import statistics
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, get_args

from dso.config.schema import HelpRule

if TYPE_CHECKING:
    from dso.config.schema import HParams

NO_WORK_LIMIT = 2  # evaluations without work in the help record that cut a peer's pay (``HelpGate.helps``)


class HelpGate(ABC):
    """One way to read a help record against the run's ``help_share``."""

    name: ClassVar[str]

    def __init__(self, share: float) -> None:
        self.share = share

    @abstractmethod
    def record_score(self, ratios: Sequence[float]) -> float:
        """What :meth:`helps` compares with the share; ``ratios`` must not be empty."""

    def helps(self, ratios: Sequence[float]) -> bool:
        """Whether the peer's updates help: paid unless its record's score falls below the share — its only ratio,
        after a single evaluation — or ``NO_WORK_LIMIT`` of the record's evaluations did no work.  No record: not
        held against it (it has no proof of computation yet and is not paid anyway).

        Two ratios, not one: an honest LossScore can be about as noisy as it is large late in a run, so one honest
        evaluation in 15–25 scores ≤ 0 (DCT codec), two in a row rarely; a peer that turns bad (noise scores ≈ 0 ×
        the median) is cut at its second bad evaluation.  The no-work count is for a miner that does the work in
        some windows only (the ``gamer``): half its evaluations show none, an honest peer's seldom two in a few
        (docs/scoring.md, "Fair, stable weights")."""
        if not ratios:
            return True
        return self.record_score(ratios) >= self.share and sum(r < 0 for r in ratios) < NO_WORK_LIMIT

    def quality(self, ratios: Sequence[float]) -> float:
        """How useful a peer's updates were, in [0, 1]: the record's score clamped to [0, 1]; 0 without a
        record."""
        if not ratios:
            return 0.0
        return min(1.0, max(0.0, self.record_score(ratios)))


class BestOfTwo(HelpGate):
    name = "best_of_two"

    def record_score(self, ratios: Sequence[float]) -> float:
        return max(ratios[-2:])


class MeanOfRecord(HelpGate):
    name = "mean_of_record"

    def record_score(self, ratios: Sequence[float]) -> float:
        """The lower of the last two ratios' mean (a no-work −1 counted 0) and the whole record's (−1 counted −1).

        The record's mean is for noise: a random update's LossScore is ≤ 0 about half the time, and late in a run
        one draw in a hundred reaches the window's median (the step's first-order term in the embedding), which the
        mean of two pays beside any small positive neighbour; counted −1, a no-work draw in the record cancels it.
        The mean of two still cuts a turncoat at its second small draw (docs/scoring.md, "A noise update as good as
        the median")."""
        mean_of_two = statistics.fmean(max(r, 0.0) for r in ratios[-2:])
        return min(mean_of_two, statistics.fmean(ratios))


HELP_GATES: dict[str, type[HelpGate]] = {gate.name: gate for gate in (BestOfTwo, MeanOfRecord)}
if set(HELP_GATES) != set(get_args(HelpRule)):  # the config's choices are these names, no more, no fewer
    raise ImportError(f"dso.config.schema.HelpRule {get_args(HelpRule)} differs from {sorted(HELP_GATES)}")


def help_gate(hp: HParams) -> HelpGate:
    """The run's help gate (``hparams.help_rule`` with ``hparams.help_share``), the one place its name is read."""
    try:
        return HELP_GATES[hp.help_rule](hp.help_share)
    except KeyError:
        raise ValueError(f"help rule must be one of {', '.join(HELP_GATES)}, got {hp.help_rule!r}") from None
