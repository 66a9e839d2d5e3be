"""The Gauntlet paper's training setup with this project's pay: what tests calibrated on the old paper mode use."""
from __future__ import annotations

from dso.config.schema import HParams
from dso.config.sources import use_profile


def use_paper_training(hp: HParams) -> HParams:
    """``hp`` with the gauntlet profile's training (one gradient, DCT codec, signed step) and the default pay rule
    with the DCT codec's weight power; returns it."""
    use_profile(hp, "gauntlet")
    hp.pay_rule, hp.weight_power = "work", 0.7
    return hp
