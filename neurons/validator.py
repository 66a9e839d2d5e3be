#!/usr/bin/env python
"""DSO validator: scores every peer each window (Gauntlet), advances θ, posts weights.

    python neurons/validator.py [--wallet.name W --wallet.hotkey H] [flags]

Each window t, after its put window closes (docs/design.md §6; with
commit-reveal, after the reveal window that follows it): gather all active
peers' payloads (strict checks, per-peer deadline; commitments) → the window
engine (neurons/engine.py: copies, the aggregate of the top-G list announced
for t, fast checks, primary evaluation, OpenSkill, μ, weights, contributions,
provenance record) → publish the aggregate, the top-G list for window t+2, the
record and (every N windows) a checkpoint → post weights.  State is saved after
every window; a restart continues exactly where it stopped.  Nothing a peer
sends can stop it: every bad input is a logged rejection.  ``--help`` lists
every flag.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from dso.chain import ChainError
from dso.config import Config, parse_args
from dso.model import model_hash
from dso.provenance import record_hash
from dso.train import evaluate
from neurons import validator_state
from neurons.context import NodeContext, build_context
from neurons.engine import (LIST_LEAD, Aggregation, WindowInputs, WindowOutcome, announce_list, genesis_lists,
                            run_window)
from neurons.follow import Follower
from neurons.lifecycle import Fatal, run_main
from neurons.reveal import settings_problem
from scoring import state as scoring_state
from storage import keys
from storage.aggregate import encode_aggregate, put_aggregate
from storage.checkpoint import save_checkpoint
from storage.cleanup import cleanup
from storage.client import StorageError
from storage.gather import GatherResult
from storage.jsonobj import put_json
from storage.peers import PeersList, put_peers
from storage.reveal import gather_window
from storage.wire import Expect

log = logging.getLogger("dso.validator")
SETTLE_SECONDS = 1.5   # after the put window closes, before gathering: S3 LastModified has 1 s resolution,
                       # so an upload is provably late only once it lands > 1 s after the close
LIST_WAIT_SECONDS = 3.0  # a non-leading validator waits this long past the settle time for the leader's list


class Validator:
    def __init__(self, ctx: NodeContext):
        self.ctx, hp = ctx, ctx.hp
        problem = settings_problem(hp)
        if problem:
            raise Fatal(problem)
        self.val_batch = ctx.dataset.validation(hp.val_sequences)
        try:
            loaded = validator_state.load(ctx.state_dir, ctx.model, hp.digest())
        except scoring_state.StateError as e:
            raise Fatal(f"saved state does not fit this run: {e} (move {ctx.state_dir} away to start fresh)")
        self.fresh = loaded is None
        if loaded:
            self.scores, self.book = loaded
            log.info("resumed at window %d (model %s…)", self.book.model_window, model_hash(ctx.model)[:10])
        else:
            self.scores = scoring_state.ValidatorState.new(hp.digest())
            self.book = validator_state.Bookkeeping(ctx.clock.current_window())
        self.follower = Follower(ctx)
        self.gather_seconds: dict[int, float] = {}  # uid → seconds the last gather spent on it (for the metrics)

    # ----------------------------------------------------------------- loop
    def leading(self) -> bool:
        return self.ctx.peers.leader_uid() in (None, self.ctx.uid)

    def run(self) -> int:
        ctx = self.ctx
        if not self.leading():
            ctx.check_manifest()
        if self.fresh:
            self.genesis()
        done = 0
        while not ctx.stop():
            t = self.book.model_window
            if not ctx.clock.sleep_until(ctx.clock.uploads_close(t, ctx.hp.commit_reveal) + SETTLE_SECONDS, ctx.stop):
                break
            try:
                self.process(t)
            except (ChainError, StorageError) as e:  # infrastructure, not peers: retry the window shortly
                log.warning("window %d: %s; retrying", t, e)
                ctx.stop.sleep(2.0)
                continue
            done += 1
            if ctx.cfg.neuron.max_windows and done >= ctx.cfg.neuron.max_windows:
                break
        log.info("stopped at window %d", self.book.model_window)
        return 0

    def genesis(self) -> None:
        """First start: θ_w = θ_0 for the current window w; publish what joining miners need."""
        ctx, t = self.ctx, self.book.model_window
        self.book.lists = genesis_lists(t, list(ctx.peers.miners()), ctx.hp.topg)
        if self.leading():
            ctx.publish_manifest()
            save_checkpoint(ctx.own.client, ctx.own.bucket, ctx.model, t, ctx.hp)
            for w, uids in self.book.lists.items():
                put_peers(ctx.own.client, ctx.own.bucket, PeersList(w, ctx.hp.protocol_version, uids))
        self.save()
        log.info("genesis at window %d with %d peers", t, len(self.book.lists[t]))

    # -------------------------------------------------------------- window
    def gather(self, t: int, peers: list[int]) -> GatherResult:
        """Window t's payloads of ``peers``, under the run's upload rules (plain or commit-reveal)."""
        ctx = self.ctx
        commitments = ctx.peers.commitments()
        self.gather_seconds = {}
        return gather_window(t, {u: commitments.get(u) for u in peers}, ctx.codec, Expect.from_hparams(ctx.hp, t),
                             ctx.clock.put_window(t), ctx.cfg.storage.gather_deadline_seconds,
                             commit_reveal=ctx.hp.commit_reveal, readers=ctx.readers,
                             peer_seconds=self.gather_seconds)

    def aggregation_list(self, t: int) -> list[int]:
        """The top-G list in effect for window t: ours when leading, else the leader's."""
        if self.leading():
            return self.book.lists.get(t, [])
        until = self.ctx.clock.uploads_close(t, self.ctx.hp.commit_reveal) + SETTLE_SECONDS + LIST_WAIT_SECONDS
        return self.follower.peers_list(t, until)[0]

    def process(self, t: int) -> dict[str, Any]:
        ctx, started = self.ctx, time.time()
        sent, received = ctx.own.client.bytes_up, ctx.own.client.bytes_down
        timings: dict[str, float] = {}
        mark = time.perf_counter()
        active = ctx.peers.miners()
        got = self.gather(t, sorted(active))
        timings["gather"] = round(time.perf_counter() - mark, 3)
        inputs = WindowInputs(t, got.payloads, got.rejections, active, self.aggregation_list(t),
                              ctx.clock.window_randomness(t))
        outcome = run_window(self.scores, ctx.model, ctx.codec, ctx.dataset, ctx.hp, inputs,
                             ledger_prev_hash=self.book.ledger_hash, validator=ctx.hotkey, device=ctx.device,
                             on_aggregate=self.publish_aggregate)
        timings["engine"] = round(time.perf_counter() - mark - timings["gather"], 3)
        self.book.ledger_hash = record_hash(outcome.record)
        self.book.lists = announce_list(self.book.lists, t, outcome.report.top_g)
        self.book.model_window = t + 1
        self.publish_window(t, outcome, t + LIST_LEAD)
        val_loss = evaluate(ctx.model, self.val_batch, ctx.hp.micro_batch, ctx.device)
        self.save()
        line = self.window_line(t, outcome, val_loss, started, timings)
        line.update(bytes_up=ctx.own.client.bytes_up - sent,  # S3 traffic and per-peer gather time: for the metrics
                    bytes_down=ctx.own.client.bytes_down - received + got.bytes_down,
                    gather_seconds={str(u): round(s, 4) for u, s in self.gather_seconds.items()})
        ctx.events.emit(line)
        log.info("window %d  val_loss %.4f  aggregated %d  evaluated %s  rejected %s  %.1fs", t, val_loss,
                 len(outcome.aggregation.used), outcome.report.evaluated,
                 {u: r.reason.value for u, r in outcome.rejections.items()}, line["seconds"])
        return line

    @staticmethod
    def window_line(t: int, outcome: WindowOutcome, val_loss: float, started: float,
                    timings: dict[str, float]) -> dict[str, Any]:
        report = outcome.report.to_dict()
        return {"window": t, "val_loss": val_loss, "model_hash": outcome.aggregation.hash_after,
                "aggregated": outcome.aggregation.used, "rule": outcome.aggregation.info.rule,
                "seconds": round(time.time() - started, 2), "timings": timings,
                "rejections": {str(u): str(r.reason.value) for u, r in outcome.rejections.items()},
                "contributions": {str(u): c.score for u, c in outcome.contributions.items()},
                **{k: v for k, v in report.items() if k in (
                    "fast", "evaluated", "loss_scores", "sync_scores", "mu", "loss_ratings", "scores", "weights",
                    "top_g")}}

    # ------------------------------------------------------------- publish
    def publish_aggregate(self, agg: Aggregation) -> None:
        """The leader publishes the aggregate as soon as it exists: nodes catching up need not wait."""
        if not self.leading():
            return
        hp = self.ctx.hp
        data = encode_aggregate(agg.signs, agg.window, agg.hash_before, agg.hash_after, agg.learning_rate,
                                hp.protocol_version, hp.digest())
        put_aggregate(self.ctx.own.client, self.ctx.own.bucket, data, agg.window, hp.protocol_version)

    def publish_window(self, t: int, outcome: WindowOutcome, announce: int) -> None:
        ctx, hp, v = self.ctx, self.ctx.hp, self.ctx.hp.protocol_version
        if t % hp.windows_per_weights == 0:
            self.post_weights(t, outcome.report.weights)
        if not self.leading():  # miners follow the leader's objects only
            return
        client, bucket = ctx.own.client, ctx.own.bucket
        put_peers(client, bucket, PeersList(announce, v, outcome.report.top_g))
        put_json(client, bucket, keys.ledger(t, v), outcome.record)
        try:
            ctx.chain.append_ledger(ctx.wallet, outcome.record)
        except ChainError as e:
            if e.reason != "unsupported":
                log.warning("window %d: ledger record not on chain: %s", t, e)
        if (t + 1) % hp.checkpoint_every == 0:
            save_checkpoint(client, bucket, ctx.model, t + 1, hp)
        if t % 10 == 0:
            cleanup(client, bucket, t, ctx.cfg.storage.retention_windows)

    def post_weights(self, t: int, weights: dict[int, float]) -> None:
        uids = sorted(u for u, w in weights.items() if w > 0)
        if not uids:
            log.info("window %d: no peer has a positive score yet; no weights posted", t)
            return
        try:
            self.ctx.chain.set_weights(self.ctx.wallet, uids, [weights[u] for u in uids])
        except ChainError as e:
            log.warning("window %d: weights refused: %s", t, e)

    def save(self) -> None:
        validator_state.save(self.ctx.state_dir, self.scores, self.ctx.model, self.book)


def main(argv: list[str] | None = None) -> int:
    cfg, _ = parse_args(argv, description=__doc__)
    return serve(cfg)


def serve(cfg: Config) -> int:
    return Validator(build_context(cfg, "validator")).run()


def cli() -> None:
    """Console entry point ``dso-validator``."""
    run_main(main)


if __name__ == "__main__":
    cli()
