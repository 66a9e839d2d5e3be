#!/usr/bin/env python
"""DSO miner: trains on its assigned data, uploads a compressed update each put window, follows the network.

    python neurons/miner.py [--wallet.name W --wallet.hotkey H] [--neuron.behaviour honest] [flags]

Each window t (DESIGN §5): train on SelectData(seed, uid, t) at θ_t → DeMo error
feedback → wait for the put window → upload update + sync samples → after the
put window, gather the updates named by the leading validator's top-G list and
apply the same signed aggregation → θ_{t+1}.  When behind (new, restarted, or
diverged) it catches up from the leader's checkpoint and aggregates.  The
error-feedback buffer is saved every window and survives restarts.
With ``hparams.commit_reveal`` the put window carries only a commitment and the
update follows in the reveal window (neurons/reveal.py); with ``hparams.dp`` the
gradient is clipped and noised first, and the miner stops uploading for good once
another round would exceed its ε budget (the accountant's state is on disk).
``python neurons/miner.py --help`` lists every flag.
"""
from __future__ import annotations

import logging
import secrets
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dso.codec import ErrorFeedback  # noqa: E402
from dso.config import parse_args  # noqa: E402
from dso.model import model_hash  # noqa: E402
from dso.privacy import PrivacyStateError, RdpAccountant, clip_and_noise  # noqa: E402
from dso.rejections import Rejection  # noqa: E402
from dso.train import compute_gradients  # noqa: E402
from neurons import behaviours, reveal  # noqa: E402
from neurons.catchup import sync_to  # noqa: E402
from neurons.follow import Follower  # noqa: E402
from neurons.node import Fatal, Node, run_main  # noqa: E402
from neurons.persist import load_tensors, save_tensors  # noqa: E402
from scoring.sync import sample_parameters, sync_positions  # noqa: E402
from storage import keys  # noqa: E402
from storage.client import StorageError  # noqa: E402
from storage.wire import Expect, PayloadMeta, decode_payload, encode_payload  # noqa: E402

log = logging.getLogger("dso.miner")
SETTLE_SECONDS = 0.5    # after the put window closes, before reading others' uploads


class Miner(Node):
    role = "miner"

    def __init__(self, cfg):
        self.behaviour = cfg.neuron.behaviour
        if self.behaviour not in behaviours.BEHAVIOURS:
            raise Fatal(f"--neuron.behaviour {self.behaviour!r}: choose from {', '.join(behaviours.BEHAVIOURS)}")
        super().__init__(cfg)
        self.feedback = ErrorFeedback(self.codec, self.hp.ef_beta, self.device)
        self.ef_file = self.state_dir / "error_feedback.safetensors"
        saved = load_tensors(self.ef_file)
        if saved is not None and self.feedback.load_state(saved):
            log.info("restored the error-feedback buffer from %s", self.ef_file)
        self.accountant, self.privacy_file = None, self.state_dir / "privacy.json"
        if self.hp.dp.enabled:
            dp = self.hp.dp
            try:
                self.accountant = RdpAccountant.load_or_create(self.privacy_file, dp.noise_multiplier, dp.delta,
                                                               range(2, dp.max_order + 1))
            except PrivacyStateError as e:  # never reset silently: that would overspend the budget
                raise Fatal(f"{e} — repair or remove it knowingly") from None
            log.info("differential privacy on: ε spent %.4f of %.4g over %d rounds", self.accountant.epsilon()[0],
                     dp.epsilon_budget, self.accountant.rounds)
        self.noise_gen = torch.Generator().manual_seed(self.hp.seed * 7919 + self.uid)  # behaviours' fake updates
        # DP noise must be unpredictable to every reader, and never repeat after a restart: seed it from the OS
        self.dp_noise = torch.Generator().manual_seed(secrets.randbits(63))
        problem = reveal.settings_problem(self.hp)
        if problem:
            raise Fatal(problem)
        self.follower = Follower(self, self.model)
        self.model_window = -1
        self.sybil_dir = Path(cfg.neuron.state_dir).expanduser() / "sybil"
        self.budget_spent = False

    # ----------------------------------------------------------------- loop
    def run(self) -> int:
        self.check_manifest()
        done = 0
        while not self.stop():
            t = self.clock.current_window()
            plan = behaviours.plan(self.behaviour, t)
            if self.model_window < 0 or (plan.apply_aggregate and self.model_window < t):
                self.model_window = sync_to(self, self.model, self.model_window, t)
            if self.hp.commit_reveal and self.model_window == t - 1 and \
                    time.time() < self.clock.put_window(t - 1).close - 1:
                # with commit-reveal the leader's aggregate of t-1 lands just before window t ends: a node that
                # catches up with it takes part in t-1 while that put window is still open (and self-aggregates
                # it) instead of chasing the next aggregate, which again lands just before its window ends
                t, plan = t - 1, behaviours.plan(self.behaviour, t - 1)
            if self.model_window > t:  # a checkpoint put us ahead of the chain: wait for that window
                self.clock.sleep_until(self.clock.window_start(self.model_window), self.stop)
            elif self.model_window == t or (self.model_window >= 0 and not plan.apply_aggregate):
                self.work(t, plan)
                done += 1
                if self.cfg.neuron.max_windows and done >= self.cfg.neuron.max_windows:
                    break
            else:  # the leader has not published what we need yet
                if self.model_window < 0:
                    log.info("window %d: waiting for the leading validator's first checkpoint", t)
                self.stop.sleep(1.0)
        save_tensors(self.ef_file, self.feedback.state())
        log.info("stopped")
        return 0

    def work(self, t: int, plan: behaviours.Plan) -> None:
        put = self.clock.put_window(t)
        started = time.time()
        up0, down0 = self.client.bytes_up, self.client.bytes_down
        self.codec.set_window(t, self.uid)
        own, loss = (self.train(t, plan.data_batches) if plan.train else (None, float("nan")))
        trained = time.time()
        if not self.clock.sleep_until(put.open, self.stop):
            return
        in_time = time.time() < put.close - 0.5 or plan.late
        if not in_time:
            log.warning("window %d: training ended after the put window; not uploading", t)
        stopped = self.budget_spent and plan.train
        if not (plan.upload and in_time) or stopped:
            uploaded = False
        elif self.hp.commit_reveal:
            uploaded = reveal.upload(self, t, plan, own, put)
        else:
            uploaded = self.upload(t, plan, own, put)
        if not self.clock.sleep_until(self.clock.uploads_close(t, self.hp.commit_reveal) + SETTLE_SECONDS,
                                      self.stop):
            return
        applied = "not following (desync)" if not plan.apply_aggregate else "replaying the leader's aggregate"
        if plan.apply_aggregate and plan.self_aggregate and self.model_window == t:
            applied = self.follower.aggregate(t)
            self.model_window = -1 if self.follower.diverged else t + 1  # -1: reload from the leader
            self.follower.diverged = False
        if own is not None:
            save_tensors(self.ef_file, self.feedback.state())
        record = {"window": t, "behaviour": self.behaviour, "loss": loss, "uploaded": uploaded,
                  "bytes_up": self.client.bytes_up - up0,
                  "bytes_down": self.client.bytes_down - down0 + self.follower.take_bytes(),
                  "t_train": round(trained - started, 3), "t_total": round(time.time() - started, 3),
                  "model_window": self.model_window, "model_hash": model_hash(self.model), "aggregated": applied}
        if self.accountant is not None:
            record["privacy"] = {"epsilon": self.accountant.epsilon()[0], "rounds": self.accountant.rounds,
                                 "budget": self.hp.dp.epsilon_budget, "stopped": self.budget_spent}
        self.emit(record)
        log.info("window %d  loss %.4f  up %.1f KB  down %.1f KB  train %.2fs  %s", t, loss,
                 record["bytes_up"] / 1e3, record["bytes_down"] / 1e3, record["t_train"], applied)

    # ------------------------------------------------------------ pieces
    def train(self, t: int, batches: int):
        hp = self.hp
        if self.accountant is not None:
            spent = self.accountant.budget_rejection(hp.dp.epsilon_budget)
            if spent is not None:  # checked before training: nothing trained is ever released
                if not self.budget_spent:
                    log.warning("window %d: %s; not uploading any more", t, spent.detail)
                self.budget_spent = True
                return None, float("nan")
        data = self.dataset.training_batch(self.uid, t, hp.assigned_sequences, hp.batch_size * batches)
        grads, loss = compute_gradients(self.model, data, hp.micro_batch, self.device)
        if self.accountant is not None:
            grads = clip_and_noise(grads, hp.dp.clip_norm, hp.dp.noise_multiplier, self.dp_noise)
            self.accountant.step()  # counted (and saved) before anything derived from it can leave the machine
            self.accountant.save(self.privacy_file)
        return self.feedback.step(grads), loss

    def upload(self, t: int, plan: behaviours.Plan, own, put) -> bool:
        data = self.build_payload(t, plan, own, put.open + 0.6, put.close)
        if data is None:
            return False
        if plan.late and not self.clock.sleep_until(put.close + behaviours.LATE_BY, self.stop):
            return False
        try:
            self.client.put(self.bucket, keys.gradient(t, self.uid, self.hp.protocol_version), data)
        except StorageError as e:
            log.warning("window %d: upload failed: %s", t, e)
            return False
        return True

    def build_payload(self, t: int, plan: behaviours.Plan, own, read_from: float, read_until: float) -> bytes | None:
        """The payload bytes this behaviour uploads for window t (None = nothing); behaviours that build on
        others' updates read them between ``read_from`` and ``read_until``."""
        randomness = self.wait_randomness(t)
        if randomness is None:
            log.warning("window %d: no chain randomness for the sync samples; not uploading", t)
            return None
        positions = sync_positions(randomness, self.shapes, self.hp.sync_samples)
        sync = sample_parameters(dict(self.model.named_parameters()), positions)
        others = self.follower.read_payloads(t, read_from, read_until, wanted=plan.reads_peers,
                                             behaviour=self.behaviour)
        if self.behaviour == "malformed":
            update = behaviours.zeros(self.codec)
        else:
            update = behaviours.transform(self.behaviour, self.codec, own, t, self.noise_gen,
                                          [p.update for p in others])
        if self.behaviour == "copier" and others:
            sync = others[0].sync_values  # a careful copier copies the victim's sync samples as well
        if self.behaviour == "sybil":
            update = self.sybil_update(t, update, sync, read_until)
        if update is None:
            return None
        data = encode_payload(self.codec, update, sync, self.meta(t))
        if self.behaviour == "malformed":
            data = behaviours.malformed_bytes(data, t)
        return data

    def meta(self, t: int) -> PayloadMeta:
        return PayloadMeta(self.uid, t, self.hp.protocol_version, self.hp.digest(), self.dataset.data_hash,
                           model_hash(self.model))

    def sybil_update(self, t: int, update, sync, until: float):
        """All sybils of a group upload the update the lowest uid of the group trained."""
        mine = encode_payload(self.codec, update, sync, self.meta(t)) if update is not None else None
        shared = behaviours.sybil_exchange(self.sybil_dir, self.uid, t, mine, until - time.time() - 0.5)
        if shared is None:
            return None
        payload = decode_payload(shared, self.codec, Expect.from_hparams(self.hp, t))
        return None if isinstance(payload, Rejection) else payload.update


def main(argv: list[str] | None = None) -> int:
    cfg, _ = parse_args(argv, description=__doc__)
    return Miner(cfg).run()


if __name__ == "__main__":
    run_main(main)
