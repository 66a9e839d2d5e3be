"""The Gauntlet in one process: peers with behaviours, the real scoring, the real aggregation — no S3, no chain.

Transport outcomes that depend on S3 are simulated with the rejection the real
gatherer would return (absent → missing, late → too_late, malformed → a format
reason) and copies are uploaded in the same second as their source (the worst
case for copy detection).  With ``hp.commit_reveal`` the outcomes are those of
storage.reveal: behaviours that read others' updates commit blind and reveal a
copy (reveal_mismatch), a late miner's commitment is late (no_commit).  With
``hp.dp.enabled`` every trainer clips and noises its gradient and keeps an RDP
accountant; once another round would exceed the budget it stops uploading
(missing).  Everything else — assigned data, error feedback, behaviour
transforms, copy detection, ``score_window``, the top-G list and the signed
aggregation — is the code the processes run.
"""
from __future__ import annotations

import copy
import hashlib
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from dso.aggregation import aggregate_signs, signed_step
from dso.codec import ErrorFeedback
from dso.config import HParams
from dso.data import Dataset
from dso.model import build_model, parameter_shapes
from dso.privacy import RdpAccountant, clip_and_noise
from dso.rejections import Reason, Rejection
from dso.sketch import make_codec
from dso.train import compute_gradients, evaluate, learning_rate
from neurons import behaviours
from scoring.copies import assigned_gains, find_copies
from scoring.state import ValidatorState
from scoring.sync import sample_parameters, sync_positions
from scoring.window import score_window

MALFORMED = (Reason.MALFORMED, Reason.WRONG_COUNT, Reason.NON_FINITE, Reason.BAD_SHAPE)


@dataclass
class SimPeer:
    uid: int
    behaviour: str
    feedback: ErrorFeedback
    model: torch.nn.Module | None = None   # own stale copy while desynchronised
    accountant: RdpAccountant | None = None  # hp.dp.enabled: privacy spent so far


@dataclass
class WindowRecord:
    window: int
    val_loss: float
    loss_scores: dict[int, float]
    ratings: dict[int, float]
    mu: dict[int, float]
    scores: dict[int, float]
    weights: dict[int, float]
    aggregated: list[int]
    rejections: dict[int, str]
    seconds: float

    def to_dict(self) -> dict:
        return {k: ({str(u): v for u, v in val.items()} if isinstance(val, dict) else val)
                for k, val in self.__dict__.items()}


@dataclass
class SimNet:
    hp: HParams
    dataset: Dataset
    roles: list[str]                     # behaviour per peer; uids are 1..n (uid 0 is the validator)
    device: str = "cpu"
    desync_windows: set[int] | None = None   # override the desync schedule (Figure 2: one 3-window stretch)
    desync_stays_behind: bool = False        # after the stretch, keep applying aggregates to the stale copy
    peers: list[SimPeer] = field(init=False)

    def __post_init__(self) -> None:
        hp = self.hp
        self.model = build_model(hp.model, hp.seed, self.device)
        self.shapes = parameter_shapes(self.model)
        self.codec = make_codec(self.shapes, hp)
        self.peers = [SimPeer(i + 1, b, ErrorFeedback(self.codec, hp.ef_beta, self.device),
                              accountant=RdpAccountant.from_config(hp.dp) if hp.dp.enabled else None)
                      for i, b in enumerate(self.roles)]
        self.state = ValidatorState.new(hp.digest(), secret=hashlib.sha256(f"sim{hp.seed}".encode()).hexdigest()[:32])
        self.top_g = [p.uid for p in self.peers][: hp.topg]
        self.val = self.dataset.validation(hp.val_sequences)
        self.noise = torch.Generator().manual_seed(hp.seed)

    def _desynced(self, peer: SimPeer, t: int) -> bool:
        if peer.behaviour != "desync":
            return False
        if self.desync_windows is not None:
            return t in self.desync_windows
        return not behaviours.plan("desync", t).apply_aggregate

    def _peer_model(self, peer: SimPeer, t: int) -> torch.nn.Module:
        if self._desynced(peer, t):
            if peer.model is None:  # stops following: keeps the model it has
                peer.model = copy.deepcopy(self.model)
            return peer.model
        if not self.desync_stays_behind:
            peer.model = None  # catches up with the network
        return peer.model if peer.model is not None else self.model

    def _train(self, peer: SimPeer, t: int, batches: int):
        """The peer's compressed update, or None once its privacy budget is spent."""
        dp = self.hp.dp
        if peer.accountant is not None and peer.accountant.would_exceed(dp.epsilon_budget):
            return None
        model = self._peer_model(peer, t)
        data = self.dataset.training_batch(peer.uid, t, self.hp.assigned_sequences, self.hp.batch_size * batches)
        grads, _ = compute_gradients(model, data, self.hp.micro_batch, self.device)
        if peer.accountant is not None:
            grads = clip_and_noise(grads, dp.clip_norm, dp.noise_multiplier, self.noise)
            peer.accountant.step()
        self.codec.set_window(t, peer.uid)
        return peer.feedback.step(grads)

    def step(self, t: int) -> WindowRecord:
        started, hp = time.perf_counter(), self.hp
        self.codec.set_window(t)
        randomness = hashlib.sha256(f"chain-randomness/{hp.seed}/{t}".encode()).digest()
        positions = sync_positions(randomness, self.shapes, hp.sync_samples)
        own, updates, rejections, sync = {}, {}, {}, {}
        sybil_update = None
        for peer in self.peers:
            plan = behaviours.plan(peer.behaviour, t)
            if plan.train and not (peer.behaviour == "sybil" and sybil_update is not None):
                own[peer.uid] = self._train(peer, t, plan.data_batches)
                if peer.behaviour == "sybil":
                    sybil_update = own[peer.uid]
            sync[peer.uid] = sample_parameters(dict(self._peer_model(peer, t).named_parameters()), positions)
        honest = [own[p.uid] for p in self.peers if p.behaviour in behaviours.GOOD and own.get(p.uid) is not None]
        for peer in self.peers:
            b = peer.behaviour
            plan = behaviours.plan(b, t)
            if b == "absent":
                rejections[peer.uid] = Rejection(Reason.MISSING, "nothing uploaded")
            elif plan.train and own.get(peer.uid) is None and not (b == "sybil" and sybil_update is not None):
                rejections[peer.uid] = Rejection(Reason.MISSING, "privacy budget spent: nothing uploaded")
            elif b == "late":
                late = (Reason.NO_COMMIT, "commitment after the put window") if hp.commit_reveal else \
                    (Reason.TOO_LATE, "uploaded after the put window")
                rejections[peer.uid] = Rejection(*late)
            elif hp.commit_reveal and plan.reads_peers:
                rejections[peer.uid] = Rejection(Reason.REVEAL_MISMATCH, "committed blind, revealed a copy")
            elif b == "malformed":
                rejections[peer.uid] = Rejection(MALFORMED[t % len(MALFORMED)], "simulated broken payload")
            elif b == "sybil":
                updates[peer.uid] = sybil_update
            else:
                update = behaviours.transform(b, self.codec, own.get(peer.uid), t, self.noise, honest)
                if update is None:
                    rejections[peer.uid] = Rejection(Reason.MISSING, "nothing to upload")
                else:
                    updates[peer.uid] = update
        lr = learning_rate(hp, t)
        same_second = {u: 0.0 for u in updates}
        rejections.update(find_copies(self.codec, updates, same_second,
                                      assigned_gains(self.model, self.codec, self.dataset, hp, t, hp.eval_scale * lr,
                                                     updates)))
        payloads = {u: (updates[u], sync[u]) for u in updates if u not in rejections}
        report = score_window(self.state, self.model, self.codec, self.dataset, hp, t, payloads, rejections,
                              [p.uid for p in self.peers], randomness)
        used = [u for u in self.top_g if u in updates]  # transport-valid payloads of the list in effect
        signs, _ = aggregate_signs(self.codec, [updates[u] for u in used], hp, used, self.device)
        signed_step(self.model, signs, lr, hp.weight_decay)
        for peer in self.peers:  # a peer that stays behind follows the network from its stale state
            if peer.model is not None and not self._desynced(peer, t):
                signed_step(peer.model, signs, lr, hp.weight_decay)
        self.top_g = report.top_g
        return WindowRecord(t, evaluate(self.model, self.val, hp.micro_batch, self.device), report.loss_scores,
                            report.loss_ratings, report.mu, report.scores, report.weights, used,
                            {u: r.reason.value for u, r in rejections.items()}, time.perf_counter() - started)

    def run(self, windows: int, on_window: Callable[[WindowRecord], None] | None = None) -> list[WindowRecord]:
        records = []
        for t in range(windows):
            records.append(self.step(t))
            if on_window:
                on_window(records[-1])
        return records


def behaviour_shares(roles: list[str], weights: dict[int, float]) -> dict[str, float]:
    """Total weight per behaviour (uid i+1 has roles[i])."""
    out: dict[str, float] = {}
    for i, role in enumerate(roles):
        out[role] = out.get(role, 0.0) + weights.get(i + 1, 0.0)
    return out
