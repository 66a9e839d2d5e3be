#!/usr/bin/env python
"""DSO miner: trains on its assigned data, uploads a compressed update each put window, follows the network.

    python neurons/miner.py [--wallet.name W --wallet.hotkey H] [flags]
    torchrun --standalone --nproc_per_node N neurons/miner.py [flags]    # one miner on N ranks (FSDP2)

Each window t (docs/design.md §5, docs/training.md): from θ_t, inner optimiser steps (dso/training/inner.py) on
SelectData(seed, uid, t) until a deadline that leaves time to encode and upload inside the put window, at
most ``hparams.inner.steps_max`` → pseudo-gradient θ_t − θ_local → DeMo error feedback → back to θ_t →
upload update + sync samples in the put window → while the leader aggregates window t, train window t+1
from θ_t, looking for the leader's bundle between steps; apply it to θ_t as every node does → θ_{t+1}, and
rebase the steps taken onto it (local ← θ_{t+1} + (local − θ_t)); window t+1 goes on from there until its
deadline.  When behind (new, restarted, or diverged) it catches up from the leader's checkpoint and
aggregates.  The error-feedback buffer and the inner optimiser's state are saved every window and survive
restarts.  With ``hparams.commit_reveal`` the put window carries only a commitment and the update follows in
the reveal window (neurons/reveal.py); with ``hparams.dp`` the gradient is clipped and noised first, and the
miner stops uploading for good once another round would exceed its ε budget (neurons/miner_privacy.py).
``python neurons/miner.py --help`` lists every flag.

A window is three steps, :meth:`Miner.train`, :meth:`Miner.upload` and :meth:`Miner.follow` (which trains
ahead: :meth:`Miner.train_ahead`); what goes into the upload is :meth:`Miner.payload` and how it goes up,
neurons/miner_upload.py; what it trains with and keeps across restarts, neurons/miner_state.py.  This module holds only
the honest implementation; experiments (``sim/``) subclass it to model other miners.  Started by torchrun, one
miner runs on several ranks: rank 0 is this miner, the model's training slices are spread over every rank
(neurons/miner_ranks.py, docs/scale.md).
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any

from dso.codec.demo import CompressedUpdate
from dso.config.schema import Config
from dso.config.sources import parse_args
from dso.data.assignment import Assignment
from dso.distributed.ranks import launched_ranks
from dso.nn.model import model_hash, state_hash
from dso.protocol.clock import GATHER_SETTLE_SECONDS
from dso.protocol.rejections import Rejection
from dso.training.inner import Ahead, InnerReport
from dso.training.train import bits_per_byte
from dso.training.window_training import Feedback, Start, train_window
from neurons import reveal
from neurons.catchup import sync_to
from neurons.context import NodeContext, build_context
from neurons.follow import Follower
from neurons.lifecycle import Fatal, run_main
from neurons.miner_privacy import MinerPrivacy
from neurons.miner_state import MinerState
from neurons.miner_upload import ENCODE_SECONDS, UPLOAD_MARGIN, MinerUploads
from storage.aggregate import Bundle

log = logging.getLogger("dso.miner")
BUNDLE_MARGIN = 3.0     # how long past the validator's gather deadline a miner waits for the window's bundle
PREFETCH_STEPS = 2      # a remote corpus: the steps' worth of sequences fetched ahead of the one training


class Miner(MinerUploads, MinerState):
    def __init__(self, ctx: NodeContext):
        self.ctx, hp = ctx, ctx.hp
        problem = reveal.settings_problem(hp)
        if problem:
            raise Fatal(problem)
        self.privacy = MinerPrivacy(hp.dp, ctx.state_dir)
        # sequences per inner step: more compute is better spent on larger steps than on more of them
        self.step_batch = ctx.cfg.neuron.step_sequences or hp.batch_size
        if self.step_batch > hp.assigned_sequences:
            raise Fatal(f"--neuron.step_sequences {self.step_batch} exceeds the {hp.assigned_sequences} sequences "
                        "the protocol assigns per window (hparams.assigned_sequences)")
        # how much of its assignment this miner may train on: all of it up to inner.steps_max steps by default
        # (the clock decides), fewer with --neuron.train_sequences; in paper mode one gradient of that many
        self.sequences = ctx.cfg.neuron.train_sequences or (
            hp.batch_size if hp.inner.mode == "gradient"
            else min(hp.inner.steps_max * self.step_batch, hp.assigned_sequences))
        if self.sequences > hp.assigned_sequences:
            raise Fatal(f"--neuron.train_sequences {self.sequences} exceeds the {hp.assigned_sequences} sequences "
                        "the protocol assigns per window (hparams.assigned_sequences)")
        ctx.model.activation_checkpointing = ctx.cfg.neuron.activation_checkpointing
        self.feedback, self.inner = self.training_parts()
        self.restore_state()
        self.encode_seconds = ENCODE_SECONDS
        self.trained_at = 0.0    # when the last window's inner training ended (time.time())
        self.last_sequences = 0  # sequences the last window trained on: how much of the next to fetch ahead
        self.margin_from = 0.0   # ... or its deadline, if earlier: the next deadline leaves the time from here
        self.report, self.ahead_steps = InnerReport(), 0
        self.timings: dict[str, float] = {}  # the window's steps other than training (its JSON record)
        self.step_seconds = 0.0  # a full inner step, as the last window measured it: bounds the next deadline
        self.follower = Follower(ctx)
        self.model_window = -1   # the model is θ_{model_window}; -1 = not synchronised yet
        self.run_checked = -1    # the window in which we last asked whether the leader still runs our run
        self.worked = -1         # the last window we trained (and uploaded) for
        # steps of window model_window taken while its θ was on its way: then the model holds the local
        # weights and the inner loop's anchor is θ_{model_window}
        self.ahead: Ahead | None = None

    # ----------------------------------------------------------------- loop
    def run(self) -> int:
        ctx = self.ctx
        ctx.join_run()
        done = 0
        while not ctx.stop():
            if not ctx.run and not ctx.join_run():
                log.info("waiting for the leading validator's run manifest")
                ctx.stop.sleep(1.0)
                continue
            t = ctx.clock.current_window()
            ctx.chain.begin_window(t)
            if t != self.run_checked:  # once a window: is the leader's run still ours?
                self.run_checked = t
                self.follow_leaders_run()
            following = self.follows(t)
            if following and self.finishes_previous(t):
                t = t - 1
            elif self.model_window < 0 or (following and self.model_window < t):
                self.catch_up(t)
            if ctx.hp.commit_reveal and self.model_window == t - 1 and \
                    time.time() < ctx.clock.put_window(t - 1).close - 1:
                # with commit-reveal the leader's aggregate of t-1 lands just before window t ends: a node that
                # catches up with it takes part in t-1 while that put window is still open (and self-aggregates
                # it) instead of chasing the next aggregate, which again lands just before its window ends
                t = t - 1
            if self.ahead is not None and self.ahead.window != t:
                self.drop_ahead()
            if self.model_window > t:  # a checkpoint put us ahead of the chain: wait for that window
                ctx.clock.sleep_until(ctx.clock.window_start(self.model_window), ctx.stop)
            elif self.model_window == t or (self.model_window >= 0 and not following):
                self.work(t)
                done += 1
                if ctx.cfg.neuron.max_windows and done >= ctx.cfg.neuron.max_windows:
                    break
            else:  # the leader has not published what we need yet
                if self.model_window < 0:
                    log.info("window %d: waiting for the leading validator's first checkpoint", t)
                ctx.stop.sleep(1.0)
        self.drop_ahead()
        self.save_state()
        log.info("stopped")
        return 0

    def catch_up(self, t: int) -> None:
        """Bring the model to θ_t as far as the leader's objects allow (neurons/catchup.py).  Steps already
        taken ahead survive when nothing was there to apply (commit-reveal: the bundle comes late)."""
        local = self.inner.local_weights() if self.ahead is not None else None
        self.inner.restore_anchor()  # θ_{model_window}: replay starts there
        before = self.theta.hash()
        reached = sync_to(self.ctx, self.model_window, t)
        if local is not None and reached == self.model_window and self.theta.hash() == before:
            self.inner.set_weights(local)
        else:
            self.ahead = None
        self.model_window = reached

    def follow_leaders_run(self) -> None:
        """Join the leader's run when it is not ours (NodeContext.moved_run): the model comes from its
        checkpoint next (catch_up from model window −1)."""
        theirs = self.ctx.moved_run()
        if theirs is not None:
            self.ctx.adopt_run(theirs)
            self.drop_ahead()
            self.model_window = -1

    def drop_ahead(self) -> None:
        """Forget steps taken ahead: the model is θ_{model_window} again."""
        if self.ahead is not None:
            self.inner.restore_anchor()
            self.ahead = None

    def work(self, t: int) -> None:
        ctx = self.ctx
        self.worked = t
        put = ctx.clock.put_window(t)
        started = time.time()
        up0, down0 = ctx.own.client.bytes_up, ctx.own.client.bytes_down
        self.report, self.ahead_steps, self.timings = InnerReport(), 0, {}
        cpu = time.process_time()
        own, loss = self.train(t)
        self.drop_ahead()  # a train() that did not use the steps taken ahead (nothing to upload): θ_t again
        trained = time.time()
        if own is not None:  # pseudo-gradient, error feedback and compression, after the inner steps
            self.timings["encode"] = round(trained - self.trained_at, 3)
        if not ctx.clock.sleep_until(put.open, ctx.stop):
            return
        up_started = time.time()
        uploaded = self.upload(t, own, put)
        self.timings["upload"] = round(time.time() - up_started, 3)
        if uploaded:  # the payload itself goes up the signature's lead later, while we train ahead (upload())
            self.keep_for_upload()
        applied = self.follow(t)
        if own is not None:
            self.save_state()
        if t % 10 == 0:
            self.clean_bucket(t)
        record = {"window": t, "loss": loss, "uploaded": uploaded, "bytes_up": ctx.own.client.bytes_up - up0,
                  "bytes_down": ctx.own.client.bytes_down - down0 + self.follower.take_bytes(),
                  "t_train": round(trained - started, 3), "t_total": round(time.time() - started, 3),
                  "inner_steps": self.report.steps, "inner_stopped": self.report.stopped,
                  "ahead_steps": self.ahead_steps,
                  "timings": {**self.timings, "cpu": round(time.process_time() - cpu, 3)},
                  "utilisation": self.utilisation(),
                  "model_window": self.model_window, "model_hash": self.theta_hash(), "aggregated": applied,
                  "tokens": 0 if own is None else self.trained[0],
                  "train_bits_per_byte": float("nan") if own is None or not self.trained[0]
                  else bits_per_byte(loss, *self.trained),
                  **self.describe()}
        privacy = self.privacy.record()
        if privacy is not None:
            record["privacy"] = privacy
        ctx.events.emit(record)
        log.info("window %d  loss %.4f  up %.1f KB  down %.1f KB  train %.2fs (%d inner steps, %s)  %s", t, loss,
                 record["bytes_up"] / 1e3, record["bytes_down"] / 1e3, record["t_train"], self.report.steps,
                 self.report.stopped or "-", applied)

    # ------------------------------------------------------ the three steps
    def train(self, t: int) -> tuple[CompressedUpdate | None, float]:
        """Our compressed update of window t and the training loss: the window's training
        (dso/training/window_training.py)
        from θ_t, or on from the steps taken ahead.  None once the privacy budget is spent or when no step fits."""
        if not self.privacy.allows(t):
            return None, float("nan")
        data = self.training_data(t)
        ahead = self.ahead.report if self.ahead is not None and self.ahead.window == t else InnerReport()
        self.ahead, self.ahead_steps = None, ahead.steps
        # without steps taken ahead the model holds θ_t, the anchor the pseudo-gradient is measured from; with
        # them it holds those steps, rebased onto θ_t (the anchor) when the bundle came: training goes on from there
        done = train_window(self.inner, self.compressor(), t, self.ctx.uid,
                            lambda _loop: self.inner_steps(t, data, ahead), start=Start(ahead=ahead.steps > 0),
                            release=self.privacy.release)
        if done.update is None:
            return None, float("nan")
        # the model is back at θ_t: sync samples, the payload's model hash and the bundle start there
        trained = data[:self.report.sequences]
        self.last_sequences = self.report.sequences
        self.trained = (trained.shape[0] * (trained.shape[1] - 1),
                        max(1, self.ctx.dataset.target_bytes(trained)))  # tokens, bytes
        return done.update, self.report.mean_loss

    def inner_steps(self, t: int, data: Assignment, ahead: InnerReport) -> InnerReport | None:
        """Window t's inner steps, on from the ``ahead`` ones, until the deadline that leaves time to upload (kept in
        ``self.report``); None when not even one step can be uploaded before the put window closes."""
        hp = self.ctx.hp
        gradient_mode = hp.inner.mode == "gradient"
        deadline = self.deadline(t)
        rest = self.inner.train(t, data.skip(ahead.sequences), batch_size=self.sequences if gradient_mode
                                else self.step_batch, max_steps=hp.inner.steps_max - ahead.steps if ahead.steps
                                else None, deadline=deadline, clock=time.time,
                                step_seconds=self.step_seconds)
        self.report = ahead.then(rest)
        if self.report.sequences:  # a full step's time, from the time per sequence (the last step may be short)
            self.step_seconds = self.report.seconds / self.report.sequences * (
                self.sequences if gradient_mode else self.step_batch)
        if self.report.steps == 0 and self.report.stopped == "deadline":
            # the deadline passed before the first step (a miner that just caught up): one step still beats a
            # zero update, which every such miner would send alike — if it can be uploaded before the put window
            # closes; otherwise its CPU goes to the next window (and to every other node on the machine)
            if not self.step_fits(t):
                log.warning("window %d: no time left for a step (%.1f s each) before the put window closes; "
                            "not uploading", t, self.step_seconds)
                return None
            self.report = self.inner.train(t, data, batch_size=self.step_batch, max_steps=1)
            deadline = math.inf  # a step taken past the deadline on purpose is not an overrun
        self.trained_at = time.time()
        self.margin_from = min(self.trained_at, deadline)  # a step that overran the deadline counts against it
        return self.report

    def training_data(self, t: int) -> Assignment:
        """The sequences it trains on in window t, in order: the first ``self.sequences`` of its assignment, read
        as training reaches them (the payload declares how many of them it got through)."""
        ctx = self.ctx
        return ctx.dataset.assignment(ctx.uid, t, ctx.hp.assigned_sequences, self.sequences,
                                      ahead=PREFETCH_STEPS * self.step_batch, next_ahead=self.last_sequences)

    def finishes_previous(self, t: int) -> bool:
        """Whether to work on window t-1 although window t has begun: θ_{t-1} came late (its bundle landed, or a
        step taken ahead ended, after window t began), nothing was uploaded for t-1 yet and its put window still
        takes an upload (its training deadline, which leaves the upload its time, has not passed) — finishing it
        keeps the steps taken ahead, where skipping it wastes them."""
        return self.model_window == t - 1 > self.worked and time.time() < self.deadline(t - 1)

    def step_fits(self, t: int) -> bool:
        """Whether one more full inner step (as the last window measured it) ends in time to upload in window t."""
        return time.time() + self.step_seconds < self.ctx.clock.put_window(t).close - UPLOAD_MARGIN

    def theta_hash(self) -> str:
        """Hash of θ_{model_window}: the model's, or while it holds steps taken ahead, the anchor's."""
        return state_hash(self.inner.anchor.items()) if self.ahead is not None else model_hash(self.ctx.model)

    def utilisation(self) -> float:
        """Inner training seconds of the window ÷ window seconds, at most 1 (a step that overran its deadline on
        a starved machine does not make a window last longer)."""
        return round(min(1.0, self.report.seconds / max(self.ctx.clock.window_seconds(), 1e-9)), 4)

    def deadline(self, t: int) -> float:
        """When inner training of window t must stop (unix time): late enough to use the window, early enough
        to compress, encode and upload inside the put window (what the last upload took, with a margin)."""
        return self.ctx.clock.put_window(t).close - UPLOAD_MARGIN - self.encode_seconds

    def compressor(self) -> Feedback:
        """What compresses the window's pseudo-gradient with error feedback (one process: the feedback itself)."""
        return self.feedback

    def follow(self, t: int) -> str:
        """Apply the leader's bundle of window t (θ_t → θ_{t+1}) once it is published; a summary for the log."""
        ctx = self.ctx
        if self.model_window != t:
            return "replaying the leader's bundles"
        until = (ctx.clock.uploads_close(t, ctx.hp.commit_reveal) + GATHER_SETTLE_SECONDS
                 + ctx.cfg.storage.gather_deadline_seconds + BUNDLE_MARGIN)
        if self.trains_ahead(t + 1):
            applied, summary = self.train_ahead(t, until)
        else:
            applied, summary = self.follower.aggregate(t, until)
        if applied:
            self.model_window = t + 1
        elif self.follower.diverged:  # reload from the leader's checkpoint
            self.model_window, self.follower.diverged = -1, False
        return summary

    def train_ahead(self, t: int, until: float) -> tuple[bool, str]:
        """Train window t+1's assignment from θ_t while the leader's bundle of window t is on its way (looking
        for it between steps), then apply the bundle to θ_t — exactly as every node does — and rebase the
        steps taken onto θ_{t+1}: local ← θ_{t+1} + (local − θ_t).  Without a bundle they are dropped."""
        ctx, nxt = self.ctx, t + 1
        data = self.training_data(nxt)
        found: list[Bundle | Rejection] = []

        def arrived() -> bool:
            got = self.follower.arrived(t)
            if got is not None:
                found.append(got)
            return got is not None or time.time() >= until or bool(ctx.stop())

        self.inner.start(None)  # the anchor is θ_t until the bundle says what θ_{t+1} is
        report = self.inner.train(nxt, data, batch_size=self.step_batch, deadline=self.deadline(nxt), clock=time.time,
                                  interrupt=arrived, step_seconds=self.step_seconds)
        waiting = time.time()
        got = found[0] if found else self.follower.bundle(t, until)  # trained all it may: wait as before
        applying = time.time()
        local = self.inner.local_weights() if report.steps else None
        self.inner.restore_anchor()  # θ_t: the bundle applies to it
        applied, summary = self.follower.apply(t, got)
        self.timings.update(wait=round(applying - waiting, 3), apply=round(time.time() - applying, 3))
        if applied and local is not None:
            self.inner.rebase_local(local)
            self.ahead = Ahead(nxt, report)
            summary += f"; {report.steps} steps of window {nxt} taken while waiting for it"
        return applied, summary

    def trains_ahead(self, t: int) -> bool:
        """Whether to train window t before its θ is known: in steps mode, while the privacy budget allows."""
        if self.ctx.hp.inner.mode != "steps" or self.privacy.stopped:
            return False
        return self.privacy.spent() is None

    def follows(self, t: int) -> bool:
        """Whether this miner keeps up with the network in window t (an honest one always does)."""
        return True

    def describe(self) -> dict[str, Any]:
        """Extra fields of the per-window record."""
        return {}



def main(argv: list[str] | None = None) -> int:
    cfg, _ = parse_args(argv, description=__doc__)
    return serve(cfg)


def serve(cfg: Config) -> int:
    if launched_ranks() > 1:  # started by torchrun: one miner on several ranks (neurons/miner_ranks.py)
        from neurons.miner_ranks import serve_ranks
        return serve_ranks(cfg)
    return Miner(build_context(cfg, "miner")).run()


def cli() -> None:
    """Console entry point ``dso-miner``."""
    run_main(main)


if __name__ == "__main__":
    cli()
