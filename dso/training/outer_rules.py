"""The outer rules as strategy objects: everything that differs between ``hparams.outer.rule`` values.

:func:`outer_rule` picks the run's rule once, from :data:`OUTER_RULES` (name → class); every other module
calls methods on the object (``dso/training/outer.py`` the aggregate and the step, ``scoring/`` the evaluation step and
the copy test, ``storage/`` the state a checkpoint holds) instead of comparing names.  The rules
(docs/training.md, "Outer step"):

* :class:`SignedRule` — the Gauntlet's: ``θ ← θ·(1 − α·wd) − α·sign(Δ)``, α = ``learning_rate(hp, t)``;
* :class:`SgdRule` — SparseLoCo's plain outer step: ``θ ← θ − lr·Δ``;
* :class:`NesterovRule` — DiLoCo's SGD with Nesterov momentum: ``m ← μ·m + Δ; θ ← θ − lr·(Δ + μ·m)``.

Every arithmetic step is kept one float32 operation at a time, in the order the bit-identity tests pin.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar, get_args

import torch

from dso.config.schema import OuterRuleName
from dso.training.train import learning_rate

if TYPE_CHECKING:
    from dso.config.schema import HParams


class OuterRule(ABC):
    """One outer rule, bound to the run's hyper-parameters."""

    name: ClassVar[str]
    signs: ClassVar[bool] = False           # Δ is sign(mean): the aggregate keeps no magnitude
    keeps_momentum: ClassVar[bool] = False  # the outer state holds one momentum tensor per parameter

    def __init__(self, hp: HParams) -> None:
        self.hp = hp

    @abstractmethod
    def lr(self, window: int) -> float:
        """The step's learning rate in ``window``."""

    # ------------------------------------------------------------ the aggregate
    @abstractmethod
    def mean_scale(self, reference: float) -> float:
        """What the exact path multiplies the mean of normalised updates by, before decoding."""

    @abstractmethod
    def rescale(self, delta: torch.Tensor, reference: float) -> torch.Tensor:
        """The robust path's decoded mean of normalised updates → this rule's Δ (before :meth:`finish`)."""

    def finish(self, delta: torch.Tensor) -> torch.Tensor:
        """The last touch on one decoded tensor of Δ (the sign, for the signed rule)."""
        return delta

    # ------------------------------------------------------------------ the step
    def direction(self, name: str, delta: torch.Tensor, momentum: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """What the step subtracts, times lr, for parameter ``name`` (updates ``momentum`` in place if any)."""
        return delta

    def decay(self, param: torch.Tensor, lr: float) -> None:
        """Weight decay applied before the step (in place); none by default."""
        return None

    # ------------------------------------------------------------ the evaluation
    @abstractmethod
    def evaluation_step(self, window: int, decoded: Mapping[str, torch.Tensor], norms: Mapping[str, float],
                        reference: Mapping[str, float]) -> dict[str, torch.Tensor]:
        """What a validator subtracts from θ_t to score one peer's decoded update (see dso.training.outer)."""


class SignedRule(OuterRule):
    """The Gauntlet's signed step with warm-up and decoupled weight decay."""

    name = "signed"
    signs = True

    def lr(self, window: int) -> float:
        return learning_rate(self.hp, window)

    def mean_scale(self, reference: float) -> float:
        return 1.0

    def rescale(self, delta: torch.Tensor, reference: float) -> torch.Tensor:
        return delta

    def finish(self, delta: torch.Tensor) -> torch.Tensor:
        return torch.sign(delta)

    def decay(self, param: torch.Tensor, lr: float) -> None:
        if self.hp.weight_decay:
            param.copy_(torch.mul(param, torch.tensor(1.0 - lr * self.hp.weight_decay, dtype=torch.float32)))

    def evaluation_step(self, window: int, decoded: Mapping[str, torch.Tensor], norms: Mapping[str, float],
                        reference: Mapping[str, float]) -> dict[str, torch.Tensor]:
        """``c·α_t·sign(Δ_p)``: the paper's evaluation."""
        c, lr = self.hp.eval_scale, self.lr(window)
        return {n: torch.sign(d) * (c * lr) for n, d in decoded.items()}


class SgdRule(OuterRule):
    """Plain SGD on the mean of normalised updates, rescaled per tensor to the selected peers' median norm."""

    name = "sgd"

    def lr(self, window: int) -> float:
        return self.hp.outer.lr

    def effective_lr(self, lr: float) -> float:
        """The weight of this window's Δ in θ_{t+1}."""
        return lr

    def mean_scale(self, reference: float) -> float:
        return reference

    def rescale(self, delta: torch.Tensor, reference: float) -> torch.Tensor:
        return delta.float() * reference

    def evaluation_step(self, window: int, decoded: Mapping[str, torch.Tensor], norms: Mapping[str, float],
                        reference: Mapping[str, float]) -> dict[str, torch.Tensor]:
        """``c·lr_eff·Δ_p·(ref/‖Δ_p‖)`` per tensor: the step the aggregate would take if every selected peer had
        sent Δ_p; a tensor with a zero or non-finite norm does not move."""
        c, lr_eff = self.hp.eval_scale, self.effective_lr(self.lr(window))
        out = {}
        for n, d in decoded.items():
            norm, ref = norms[n], reference.get(n, 0.0)
            factor = c * lr_eff * ref / norm if math.isfinite(norm) and norm > 0 else 0.0
            out[n] = d * factor
        return out


class NesterovRule(SgdRule):
    """SGD with Nesterov momentum on the same Δ; the momentum is part of the outer state."""

    name = "nesterov"
    keeps_momentum = True

    def effective_lr(self, lr: float) -> float:
        return lr * (1.0 + self.hp.outer.momentum)

    def direction(self, name: str, delta: torch.Tensor, momentum: Mapping[str, torch.Tensor]) -> torch.Tensor:
        mu32 = torch.tensor(self.hp.outer.momentum, dtype=torch.float32)
        m = momentum[name]
        m.copy_(torch.add(torch.mul(m, mu32), delta.cpu()))
        return torch.add(delta, torch.mul(m.to(delta.device), mu32))


OUTER_RULES: dict[str, type[OuterRule]] = {rule.name: rule for rule in (SignedRule, SgdRule, NesterovRule)}
if set(OUTER_RULES) != set(get_args(OuterRuleName)):  # the config's choices are these names, no more, no fewer
    raise ImportError(f"dso.config.schema.OuterRuleName {get_args(OuterRuleName)} differs from {sorted(OUTER_RULES)}")


def outer_rule(hp: HParams) -> OuterRule:
    """The run's outer rule (``hparams.outer.rule``), the one place its name is read."""
    try:
        return OUTER_RULES[hp.outer.rule](hp)
    except KeyError:
        raise ValueError(f"outer rule must be one of {', '.join(OUTER_RULES)}, got {hp.outer.rule!r}") from None
