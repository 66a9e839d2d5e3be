"""A miner's differential privacy (``hparams.dp``): clip and noise every update it releases, count each
round on disk before anything derived from it leaves the machine, and stop for good once another round
would exceed the ε budget.  With DP off it releases updates unchanged and never stops."""
from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Any

import torch

from dso.config.schema import DPConfig
from dso.privacy.dp import PrivacyStateError, RdpAccountant, clip_and_noise, dp_settings
from dso.protocol.rejections import Rejection
from neurons.lifecycle import Fatal

log = logging.getLogger("dso.miner")


class MinerPrivacy:
    def __init__(self, dp: DPConfig, state_dir: Path):
        self.clip_norm = dp.clip_norm
        self.noise_multiplier, self.budget = dp_settings(dp)  # z and budget, or from dp.target_epsilon
        self.file = state_dir / "privacy.json"
        self.accountant = self._load(dp) if dp.enabled else None
        # DP noise must be unpredictable to every reader, and never repeat after a restart: seed it from the OS
        self.noise = torch.Generator().manual_seed(secrets.randbits(63))
        self.stopped = False

    def _load(self, dp: DPConfig) -> RdpAccountant:
        try:
            accountant = RdpAccountant.load_or_create(self.file, self.noise_multiplier, dp.delta,
                                                      range(2, dp.max_order + 1))
        except PrivacyStateError as e:  # never reset silently: that would overspend the budget
            raise Fatal(f"{e} — repair or remove it knowingly") from None
        log.info("differential privacy on: ε spent %.4f of %.4g over %d rounds", accountant.epsilon()[0],
                 self.budget, accountant.rounds)
        return accountant

    def spent(self) -> Rejection | None:
        """Why another round would exceed the privacy budget (None: it would not, or DP is off)."""
        return None if self.accountant is None else self.accountant.budget_rejection(self.budget)

    def allows(self, t: int) -> bool:
        """Whether window t may train a round (checked before training: nothing trained is ever released);
        the first refusal is logged and is for good."""
        spent = self.spent()
        if spent is None:
            return True
        if not self.stopped:
            log.warning("window %d: %s; not uploading any more", t, spent.detail)
        self.stopped = True
        return False

    def release(self, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The update as it may leave the machine: clipped and noised, the round counted and saved first."""
        if self.accountant is None:
            return grads
        grads = clip_and_noise(grads, self.clip_norm, self.noise_multiplier, self.noise)
        self.accountant.step()
        self.accountant.save(self.file)
        return grads

    def record(self) -> dict[str, Any] | None:
        """The window record's privacy fields (None with DP off)."""
        if self.accountant is None:
            return None
        return {"epsilon": self.accountant.epsilon()[0], "rounds": self.accountant.rounds, "budget": self.budget,
                "stopped": self.stopped}
