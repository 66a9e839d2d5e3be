"""The Gauntlet in one process: peers with behaviours and the validator's own window engine — no S3, no chain.

Transport outcomes that depend on S3 are simulated with the rejection the real
gatherer would return (absent → missing, late → too_late, malformed → a format
reason) and copies are uploaded in the same second as their source (the worst
case for copy detection).  With ``hp.commit_reveal`` the outcomes are those of
storage.reveal: behaviours that read others' updates commit blind and reveal a
copy (reveal_mismatch), a late miner's commitment is late (no_commit).  With
``hp.dp.enabled`` every trainer clips and noises its gradient and keeps an RDP
accountant; once another round would exceed the budget it stops uploading
(missing).  The ``gamer`` decides each window from what it can foresee of the evaluation schedule
(sim/foresight.py).  Everything else — assigned data, error feedback, behaviour
transforms, copy detection, ``score_window``, the top-G list and the signed
aggregation — is the code the processes run: each window ends in
:func:`neurons.engine.run_window`, the function the validator process calls.
"""
from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from dso.codec.codecs import Update, make_codec
from dso.codec.demo import ErrorFeedback
from dso.config.schema import HParams
from dso.data.dataset import Dataset
from dso.nn.model import build_model, parameter_shapes, sync_sample_count
from dso.privacy.dp import RdpAccountant, dp_settings, noisy_release
from dso.protocol.payload import Payload, PayloadMeta
from dso.protocol.rejections import Reason, Rejection
from dso.training.inner import InnerLoop
from dso.training.outer import OuterState, apply_outer
from dso.training.train import evaluate
from dso.training.window_training import Start, train_window
from neurons.engine import WindowInputs, WindowOutcome, announce_list, genesis_lists, run_window
from scoring.schedules import DRAWN, EvalSchedule
from scoring.state import ValidatorState
from scoring.sync import sample_parameters, sync_positions
from sim import behaviours
from sim.foresight import evaluation_chance


@dataclass
class SimPeer:
    uid: int
    behaviour: behaviours.Behaviour
    feedback: ErrorFeedback
    model: torch.nn.Module | None = None   # own stale copy while desynchronised
    outer: OuterState | None = None         # and the outer state that goes with it
    accountant: RdpAccountant | None = None  # hp.dp.enabled: privacy spent so far
    inner_state: dict[str, torch.Tensor] | None = None  # its inner optimiser's state (dso.training.inner)


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
    evaluated: list[int] = field(default_factory=list)   # S_t
    trained: list[int] = field(default_factory=list)     # peers that trained this window
    assigned_deltas: dict[int, float] = field(default_factory=dict)  # δ_assigned of S_t
    poc_statistics: dict[int, float] = field(default_factory=dict)   # the proof of computation's statistic of S_t

    def to_dict(self) -> dict[str, Any]:
        """The record as one JSON object (uid keys as strings)."""
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
    inner_steps: int = 2                     # an honest peer's inner steps per window (a diligent one: × its batches)
    schedule: EvalSchedule = DRAWN           # the validator's evaluation schedule (scoring/schedules.py)
    peers: list[SimPeer] = field(init=False)

    def __post_init__(self) -> None:
        hp = self.hp
        self.model = build_model(hp.model, hp.seed, self.device)
        self.shapes = parameter_shapes(self.model)
        self.codec = make_codec(self.shapes, hp)
        self.outer = OuterState.fresh(self.shapes, hp)
        # the miner's inner loop on one scratch model; each peer's own optimiser state is swapped in and out
        self.inner = InnerLoop(copy.deepcopy(self.model), hp)
        self.peers = [SimPeer(i + 1, behaviours.make(b), ErrorFeedback(self.codec, hp.ef_beta, self.device),
                              accountant=RdpAccountant.from_config(hp.dp) if hp.dp.enabled else None)
                      for i, b in enumerate(self.roles)]
        self.state = ValidatorState.new(hp.digest(), secret=hashlib.sha256(f"sim{hp.seed}".encode()).hexdigest()[:32])
        self.lists = genesis_lists(0, [p.uid for p in self.peers], hp.topg)  # the validator's list schedule
        self.active = {p.uid: f"sim-{p.uid}" for p in self.peers}
        self.val = self.dataset.validation(hp.val_sequences)
        self.noise = torch.Generator().manual_seed(hp.seed)
        self.ledger_hash = ""
        self.last_outcome: WindowOutcome | None = None  # the engine's full output of the latest window
        self.trained: dict[int, int] = {}  # uid → sequences it trained on in the latest window
        self.dp_noise_multiplier, self.dp_budget = dp_settings(hp.dp)  # z and budget (hp.dp.target_epsilon)

    def _desynced(self, peer: SimPeer, t: int) -> bool:
        return not peer.behaviour.follows(t, self.desync_windows)

    def _peer_model(self, peer: SimPeer, t: int) -> torch.nn.Module:
        if self._desynced(peer, t):
            if peer.model is None:  # stops following: keeps the model it has
                peer.model, peer.outer = copy.deepcopy(self.model), copy.deepcopy(self.outer)
            return peer.model
        if not self.desync_stays_behind:
            peer.model, peer.outer = None, None  # catches up with the network
        return peer.model if peer.model is not None else self.model

    def _train(self, peer: SimPeer, t: int, batches: int) -> Update | None:
        """The peer's compressed update, or None once its privacy budget is spent; records the sequences it trained
        on in ``self.trained``."""
        if peer.accountant is not None and peer.accountant.would_exceed(self.dp_budget):
            return None
        model, hp = self._peer_model(peer, t), self.hp
        # the miner's window (dso/training/window_training.py) on the scratch loop, with the peer's own optimiser state:
        # ``batches`` × inner_steps steps on the assignment, or in paper mode one gradient of ``batches`` batches
        batch_size, max_steps = self.inner_budget(batches)
        data = peer.behaviour.training_data(self.dataset, peer.uid, t, hp.assigned_sequences)
        release = None if peer.accountant is None else noisy_release(
            hp.dp.clip_norm, self.dp_noise_multiplier, self.noise, peer.accountant)
        done = train_window(self.inner, peer.feedback, t, peer.uid,
                            lambda loop: loop.train(t, data, batch_size=batch_size, max_steps=max_steps),
                            start=Start(dict(model.named_parameters()), state=peer.inner_state or {}), release=release)
        self.trained[peer.uid], peer.inner_state = done.report.sequences, done.state
        return done.update

    def inner_budget(self, batches: int) -> tuple[int, int]:
        """(sequences per inner step, inner steps) of a peer that trains ``batches`` times the baseline: more
        steps of batch_size (at the simulator's few inner steps that scores higher; at the local network's
        8-10 larger steps do: scripts/benchmarks/extra_compute.py), or in paper mode one larger gradient."""
        if self.hp.inner.mode == "gradient":
            return self.hp.batch_size * batches, self.inner_steps * batches
        return self.hp.batch_size, self.inner_steps * batches

    def randomness(self, t: int) -> bytes:
        return hashlib.sha256(f"chain-randomness/{self.hp.seed}/{t}".encode()).digest()

    def eval_seed(self, t: int) -> bytes:
        """The chain randomness of a block after window t's uploads closed (draws F_t and S_t)."""
        return hashlib.sha256(f"chain-eval-randomness/{self.hp.seed}/{t}".encode()).digest()

    def previous_aggregate(self) -> dict[str, torch.Tensor] | None:
        """The previous window's Δ: public (anyone can recompute it from the bundle)."""
        return None if self.last_outcome is None else self.last_outcome.aggregation.delta

    def plan(self, peer: SimPeer, t: int) -> behaviours.Plan:
        """What the peer does in window t, given the most it could foresee of the evaluation schedule."""
        return peer.behaviour.plan(t, lambda: evaluation_chance(self.state, self.hp, self.schedule, t, peer.uid,
                                                                          self.active))

    def honest_sequences(self) -> int:
        """The sequences an honest peer trains on per window (what a peer that did not train declares)."""
        batch_size, steps = self.inner_budget(1)
        return batch_size if self.hp.inner.mode == "gradient" else batch_size * steps

    def uploads(self, t: int) -> tuple[dict[int, Payload], dict[int, Rejection]]:
        """What every peer's behaviour puts on the wire in window t, as the validator's gather would see it:
        payloads that pass the transport checks, and the transport rejections of the others."""
        hp = self.hp
        positions = sync_positions(self.randomness(t), self.shapes, sync_sample_count(hp))
        own: dict[int, Update | None] = {}
        sync: dict[int, torch.Tensor] = {}
        sybil_update = None  # the update every peer that shares one uploads: the first of them trains it
        plans = {peer.uid: self.plan(peer, t) for peer in self.peers}
        self.trained = {}
        for peer in self.peers:
            plan = plans[peer.uid]
            if plan.train and not (peer.behaviour.shares_update and sybil_update is not None):
                own[peer.uid] = self._train(peer, t, plan.data_batches)
                if peer.behaviour.shares_update:
                    sybil_update = own[peer.uid]
            sync[peer.uid] = sample_parameters(dict(self._peer_model(peer, t).named_parameters()), positions)
        honest = [u for p in self.peers if p.behaviour.good and (u := own.get(p.uid)) is not None]
        updates: dict[int, Update] = {}
        rejections: dict[int, Rejection] = {}
        for peer in self.peers:
            outcome = self._outcome(peer, t, plans[peer.uid], own, sybil_update, honest)
            if isinstance(outcome, Rejection):
                rejections[peer.uid] = outcome
            else:
                updates[peer.uid] = outcome
        # copies land in the same second as their source: the worst case for copy detection.  Every payload is
        # seen by the validator in its one look at the close of the put window (seen = 0.0); a backdater serves
        # a forged, earlier LastModified, which nothing may trust
        honest_count = self.honest_sequences()
        declared = {p.uid: p.behaviour.declared(self.trained.get(p.uid, 0), honest_count) for p in self.peers}
        forges = {p.uid: p.behaviour.forges for p in self.peers}
        payloads = {u: Payload(PayloadMeta(u, t, hp.protocol_version, hp.digest(), trained=declared[u]), update,
                               sync[u], 0, -behaviours.BACKDATE_BY if forges[u] else 0.0, seen=0.0)
                    for u, update in updates.items()}
        return payloads, rejections

    def _outcome(self, peer: SimPeer, t: int, plan: behaviours.Plan, own: dict[int, Update | None],
                 sybil_update: Update | None, honest: list[Update]) -> Update | Rejection:
        """One peer's update, or the rejection the real gatherer would return for what it uploaded."""
        behaviour, hp = peer.behaviour, self.hp
        shared = behaviour.shares_update and sybil_update is not None
        if not plan.upload:
            return Rejection(Reason.MISSING, "nothing uploaded")
        if plan.train and own.get(peer.uid) is None and not shared:
            return Rejection(Reason.MISSING, "privacy budget spent: nothing uploaded")
        if plan.late and behaviour.forges:  # its forged LastModified says in time; the look (at the commitments,
            # under commit-reveal) after the close did not see it
            return Rejection(Reason.NO_COMMIT, "commitment absent when the validator looked") if hp.commit_reveal \
                else Rejection(Reason.TOO_LATE, "absent when the validator looked after the close")
        if plan.late:
            return Rejection(Reason.NO_COMMIT, "commitment after the put window") if hp.commit_reveal else \
                Rejection(Reason.TOO_LATE, "uploaded after the put window")
        if hp.commit_reveal and plan.reads_peers:
            return Rejection(Reason.REVEAL_MISMATCH, "committed blind, revealed a copy")
        if (broken := behaviour.simulated_rejection(t)) is not None:
            return broken
        if shared and sybil_update is not None:
            return sybil_update
        inputs = behaviours.Inputs(self.codec, t, own.get(peer.uid), self.noise, honest, self.previous_aggregate())
        update = peer.behaviour.upload(inputs)
        return Rejection(Reason.MISSING, "nothing to upload") if update is None else update

    def step(self, t: int) -> WindowRecord:
        started = time.perf_counter()
        payloads, rejections = self.uploads(t)
        return self.conclude(t, payloads, rejections, started)

    def conclude(self, t: int, payloads: dict[int, Payload], rejections: dict[int, Rejection],
                 started: float | None = None) -> WindowRecord:
        """The validator's window over these uploads (the engine), then every peer follows the network."""
        started, hp = time.perf_counter() if started is None else started, self.hp
        inputs = WindowInputs(t, payloads, rejections, self.active, self.lists.get(t, []), self.randomness(t),
                              self.eval_seed(t), previous_aggregate=self.previous_aggregate())
        outcome = run_window(self.state, self.model, self.codec, self.dataset, hp, inputs, outer=self.outer,
                             ledger_prev_hash=self.ledger_hash, validator="simulator", device=self.device,
                             schedule=self.schedule)
        self.ledger_hash = outcome.record["record_hash"]
        agg = outcome.aggregation
        for peer in self.peers:  # a peer that stays behind follows the network from its stale state
            if peer.model is not None and peer.outer is not None and not self._desynced(peer, t):
                apply_outer(dict(peer.model.named_parameters()), agg.delta, peer.outer, hp, t)
        self.lists = announce_list(self.lists, t, outcome.report.top_g)
        self.last_outcome = outcome
        report = outcome.report
        return WindowRecord(t, evaluate(self.model, self.val, hp.micro_batch, self.device), report.loss_scores,
                            report.loss_ratings, report.mu, report.scores, report.weights, agg.used,
                            {u: r.reason.value for u, r in outcome.rejections.items()}, time.perf_counter() - started,
                            list(report.evaluated), sorted(self.trained), dict(report.assigned_deltas),
                            dict(report.poc_statistics))

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
