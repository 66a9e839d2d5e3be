#!/usr/bin/env python
"""DSO validator: scores every peer each window (Gauntlet), advances θ, posts weights.

    python neurons/validator.py [--wallet.name W --wallet.hotkey H] [flags]

Each window t, after its put window closes (docs/design.md §6; with
commit-reveal, after the reveal window that follows it): gather all active
peers' payloads (strict checks, per-peer deadline; commitments) → the window
engine (neurons/engine.py: the aggregate of the top-G list announced for t,
copies, fast checks, primary evaluation, OpenSkill, μ, weights, contributions,
provenance record) → publish the window's bundle (at once), the top-G list for
window t+2, the record and (every N windows) a checkpoint → post weights.  A
validator that does not lead applies the leader's bundle, so it holds the
network's θ, and republishes it with its checkpoints: when the leader stops,
the next validator by stake already holds every bundle miners need.  State is
saved after every window; a restart continues exactly where it stopped.
Nothing a peer sends can stop it: every bad input is a logged rejection.
``--help`` lists every flag.
"""
from __future__ import annotations

import copy
import logging
import secrets
import time
from typing import Any

import torch

from dso.chain import ChainError
from dso.chain.factory import open_chain
from dso.chain.roles import VALIDATOR, role_of
from dso.chain.writer import ChainWriter, WriteResult
from dso.config.schema import Config
from dso.config.sources import parse_args
from dso.distributed.ranks import launched_ranks
from dso.nn.model import model_hash
from dso.protocol.clock import GATHER_SETTLE_SECONDS, certain_after
from dso.protocol.payload import Payload
from dso.protocol.provenance import record_hash
from dso.training.train import bits_per_byte, evaluate
from neurons import validator_state
from neurons.catchup import sync_to
from neurons.context import NodeContext, build_context
from neurons.engine import LIST_LEAD, Aggregation, WindowInputs, WindowOutcome, announce_list, genesis_lists, run_window
from neurons.follow import Follower
from neurons.leader_check import Disagreement, choose_bundle
from neurons.lifecycle import Fatal, run_main
from neurons.reveal import settings_problem
from neurons.validator_uploads import ValidatorUploads
from scoring import state as scoring_state
from scoring.evaluation import ParameterSnapshot, PeerEvaluator
from storage import keys
from storage.aggregate import encode_bundle, put_bundle
from storage.checkpoint import CheckpointSaver, save_checkpoint
from storage.cleanup import cleanup
from storage.client import MiB, StorageError
from storage.gather import GatherResult
from storage.jsonobj import put_json
from storage.look import Look
from storage.peers import PeersList, put_peers

log = logging.getLogger("dso.validator")
BUNDLE_WAIT_SECONDS = 6.0  # a validator that does not lead waits this long past its own gather for the bundle
SENIOR_WAIT_WINDOWS = 3    # at first start, how long to wait for a validator with more stake to start the run
CAUGHT_UP_WINDOWS = 2      # a validator further behind the chain than this posts no weights (it does not lead)


class Validator(ValidatorUploads):
    def __init__(self, ctx: NodeContext):
        self.ctx, hp = ctx, ctx.hp
        problem = settings_problem(hp)
        if problem:
            raise Fatal(problem)
        self.val_batch = ctx.dataset.validation(hp.val_sequences)
        # bits per byte compare runs across tokenisers: the held-out batch's tokens and the bytes they stand for
        self.val_tokens = self.val_batch.shape[0] * (self.val_batch.shape[1] - 1)
        self.val_bytes = ctx.dataset.target_bytes(self.val_batch)
        try:
            loaded = validator_state.load(ctx.state_dir, ctx.model, hp.digest(), hp)
        except scoring_state.StateError as e:
            raise Fatal(f"saved state does not fit this run: {e} (move {ctx.state_dir} away to start fresh)") from e
        self.fresh = loaded is None
        if loaded:
            self.scores, self.book = loaded
            ctx.run, ctx.outer = self.book.run, self.book.outer
            log.info("resumed run %s at window %d (model %s…)", ctx.run, self.book.model_window,
                     model_hash(ctx.model)[:10])
        else:
            self.scores = scoring_state.ValidatorState.new(hp.digest())
            self.book = validator_state.Bookkeeping(ctx.clock.current_window())
        self.follower = Follower(ctx)
        # chain writes that wait for finality run on their own thread, with their own connection
        self.writer_chain = open_chain(ctx.cfg)
        self.writer = ChainWriter(log_path=ctx.state_dir / "chain_writes.jsonl", on_result=self.on_chain_write)
        mine = ctx.chain.weights().get(ctx.uid, {})
        self.last_row: dict[int, float] = {u: w for u, w in mine.items() if u != ctx.uid and w > 0}
        self.gather_seconds: dict[int, float] = {}  # uid → seconds the last gather spent on it (for the metrics)
        self.look: Look | None = None  # what the last look at the close of the uploads saw (storage/look.py)
        self.commitments_look: Look | None = None  # commit-reveal: the look at the commitments, before the reveals
        self.previous_delta: dict[str, torch.Tensor] | None = None  # the last aggregate Δ (a replay of it is a copy)
        # checkpoints upload in the background while the validator waits for the next uploads; it waits for a
        # save still running only before it next changes θ (CheckpointSaver.wait)
        self.checkpoints = CheckpointSaver(ctx.own.client, ctx.own.bucket, ctx.cfg.storage.checkpoint_shard_mib * MiB)
        self.bundle_published: float | None = None   # when this window's bundle went out (unix time)
        self.evaluator: PeerEvaluator | None = None   # set on a torchrun validator: its ranks share the peers
        self.silent: set[int] = set()  # peers that gave the last watch no answer: asked last (storage/look.py)
        self.leader_check: Disagreement | None = None  # the last window's check of the bundle we were to follow

    # ----------------------------------------------------------------- loop
    def leading(self, window: int | None = None) -> bool:
        """Whether we lead ``window`` (default: the latest settled block's leader); with no leader at all, too."""
        return self.ctx.peers.leader_uid(window) in (None, self.ctx.uid)

    def run(self) -> int:
        ctx = self.ctx
        if self.fresh and not self.genesis():
            return 0
        done = 0
        while not ctx.stop():
            self.follow_leaders_run()
            t = self.book.model_window
            close = ctx.clock.uploads_close(t, ctx.hp.commit_reveal)
            if ctx.hp.commit_reveal:
                self.commitments_look = self.look_at_commitments(t)
            first = self.watch_uploads(t, close)
            if not ctx.clock.sleep_until(certain_after(close), ctx.stop):
                break
            self.look = self.look_at_close(t, close, first)
            if not ctx.clock.sleep_until(close + GATHER_SETTLE_SECONDS, ctx.stop):
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
        self.checkpoints.wait()
        self.writer.close(timeout=10.0)
        log.info("stopped at window %d", self.book.model_window)
        return 0

    def genesis(self) -> bool:
        """First start: join the run a live protocol validator leads, at its latest checkpoint.  With none,
        and no validator with more stake about to start one, begin a new run: θ_0 at the current window and a
        fresh run id.  False if stopped while waiting."""
        ctx = self.ctx
        give_up = time.time() + SENIOR_WAIT_WINDOWS * ctx.clock.window_seconds()
        while True:
            if ctx.join_run():
                t = sync_to(ctx, -1, ctx.clock.current_window())
                if t >= 0:
                    break
            elif not self.senior_expected() or time.time() > give_up:
                t = ctx.clock.current_window()
                ctx.run = secrets.token_hex(8)
                save_checkpoint(ctx.own.client, ctx.own.bucket, ctx.model, t, ctx.hp, ctx.run, ctx.outer)
                self.heartbeat()  # live on chain at once: joining nodes look for the live leader
                break
            log.info("waiting for the leading validator's run and first checkpoint")
            if not ctx.stop.sleep(1.0):
                return False
        self.start_run(t)
        return True

    def start_run(self, t: int) -> None:
        """Take part in ``ctx.run`` from window t, with our model at θ_t: its manifest, fresh bookkeeping (the
        peers' ratings stay) and, when we lead, the first top-G lists."""
        ctx = self.ctx
        ctx.publish_manifest(t)
        self.book = validator_state.Bookkeeping(t, genesis_lists(t, list(ctx.peers.miners()), ctx.hp.topg),
                                                run=ctx.run)
        self.previous_delta = None
        if self.leading():
            for w, uids in self.book.lists.items():
                put_peers(ctx.own.client, ctx.own.bucket, PeersList(w, ctx.hp.protocol_version, tuple(uids)), ctx.run)
        self.save()
        log.info("genesis of run %s at window %d with %d peers", ctx.run, t, len(self.book.lists[t]))

    def follow_leaders_run(self) -> None:
        """Leave our run for the leader's when they differ (NodeContext.moved_run): its latest checkpoint and
        bundles.  Our run and model stay when the leader's cannot be loaded yet; we try again next window."""
        ctx = self.ctx
        theirs = None if self.leading() else ctx.moved_run()
        if theirs is None:
            return
        self.checkpoints.wait()  # the model may change below
        ours, ctx.run = ctx.run, theirs
        t = sync_to(ctx, -1, ctx.clock.current_window())  # −1 (nothing loaded) leaves the model and outer state
        if t < 0:
            ctx.run = ours
            return
        self.start_run(t)

    def senior_expected(self) -> bool:
        """A protocol validator with more stake than ours is registered: it will start (or lead) the run."""
        graph, commitments = self.ctx.chain.metagraph(), self.ctx.chain.commitments()
        mine = next((n.stake for n in graph if n.uid == self.ctx.uid), 0.0)
        # a permit holder with the validator tag, or with no commitment yet (it may be one still starting)
        return any(n.stake > mine and n.validator_permit and n.uid != self.ctx.uid
                   and (commitments.get(n.uid) is None or role_of(commitments.get(n.uid)) == VALIDATOR)
                   for n in graph)

    def caught_up(self, t: int) -> bool:
        """Whether window t is recent: a validator replaying a backlog must not post (and so lead) yet."""
        return t >= self.ctx.clock.current_window() - CAUGHT_UP_WINDOWS

    # -------------------------------------------------------------- window
    def leader_bundle(self, t: int, got: GatherResult) -> dict[int, Payload] | None:
        """What a validator that does not lead aggregates: the leader's bundle, once checked against our own gather
        and list (neurons/leader_check.py: a bundle holding a payload its miner did not sign, or one we rejected,
        is not followed, nor is its validator again; then the next validator's by stake).  None when leading,
        when we are the next to follow, or when no bundle came in time: then our own list (docs/protocol.md).  A
        bundle that does not start from our θ_t means we went our own way (e.g. in a window the old leader died
        in): we reload the leader's checkpoint and bundles up to t first."""
        self.leader_check = None
        if self.leading(t):
            return None
        selection = [u for u in self.book.lists.get(t, []) if u in got.payloads]
        bundle, self.leader_check = choose_bundle(self.ctx, self.follower, t, got.payloads, got.rejections,
                                                  selection, time.time() + BUNDLE_WAIT_SECONDS)
        if bundle is None:
            return None
        if bundle.model_hash_before != model_hash(self.ctx.model):
            log.warning("window %d: the bundle we follow starts from another model; re-synchronising", t)
            ours, our_outer = ParameterSnapshot(self.ctx.model), copy.deepcopy(self.ctx.outer)
            if sync_to(self.ctx, -1, t) != t or model_hash(self.ctx.model) != bundle.model_hash_before:
                ours.restore()
                self.ctx.outer = our_outer
                log.warning("window %d: could not reach that model; aggregating our own list", t)
                return None
        return {u: bundle.payloads[u] for u in bundle.uids}

    def process(self, t: int) -> dict[str, Any]:
        ctx, started = self.ctx, time.time()
        ctx.chain.begin_window(t)
        sent, received = ctx.own.client.bytes_up, ctx.own.client.bytes_down
        timings: dict[str, float] = {}
        waited = time.perf_counter()
        self.checkpoints.wait()  # θ changes in this window: a checkpoint still uploading must be done first
        timings["checkpoint_wait"] = round(time.perf_counter() - waited, 3)
        mark, cpu = time.perf_counter(), time.process_time()
        self.bundle_published = None
        active = ctx.peers.miners()
        got = self.gather(t, active)
        timings["gather"] = round(time.perf_counter() - mark, 3)
        # who is evaluated: drawn from a block made after the uploads closed, so no miner knows it in advance
        eval_seed = ctx.clock.eval_randomness(t, ctx.hp.commit_reveal, ctx.stop)
        inputs = WindowInputs(t, got.payloads, got.rejections, active, self.book.lists.get(t, []),
                              ctx.clock.window_randomness(t), eval_seed, bundle=self.leader_bundle(t, got),
                              previous_aggregate=self.previous_delta)
        outcome = run_window(self.scores, ctx.model, ctx.codec, ctx.dataset, ctx.hp, inputs, outer=ctx.outer,
                             ledger_prev_hash=self.book.ledger_hash, validator=ctx.hotkey, device=ctx.device,
                             on_aggregate=self.publish_aggregate, evaluator=self.evaluator)
        timings["engine"] = round(time.perf_counter() - mark - timings["gather"], 3)
        self.book.ledger_hash = record_hash(outcome.record)
        looked, self.previous_delta, self.look = self.look, outcome.aggregation.delta, None
        looked_at_commitments, self.commitments_look = self.commitments_look, None
        self.book.lists = announce_list(self.book.lists, t, outcome.report.top_g)
        self.book.model_window = t + 1
        self.publish_window(t, outcome, t + LIST_LEAD)
        val_loss = evaluate(ctx.model, self.val_batch, ctx.hp.micro_batch, ctx.device)
        self.save()
        # what the window cost this process in CPU, and how long after the uploads closed the bundle every other
        # node waits for was out (docs/operations.md): a validator short of CPU shows it here first
        timings["cpu"] = round(time.process_time() - cpu, 3)
        if self.bundle_published is not None:
            timings["bundle_after_close"] = round(
                self.bundle_published - ctx.clock.uploads_close(t, ctx.hp.commit_reveal), 3)
        line = self.window_line(t, outcome, val_loss, started, timings)
        line["val_bits_per_byte"] = bits_per_byte(val_loss, self.val_tokens, self.val_bytes)
        line["leading"] = self.leading(t)
        line.update(bytes_up=ctx.own.client.bytes_up - sent,  # S3 traffic and per-peer gather time: for the metrics
                    bytes_down=ctx.own.client.bytes_down - received + got.bytes_down,
                    gather_seconds={str(u): round(s, 4) for u, s in self.gather_seconds.items()})
        line["look"] = looked.summary() if looked is not None else None  # how late the look ran (docs/scoring.md)
        if self.leader_check is not None:  # the leader's bundle against our own gather and list (metrics)
            line["leader"] = self.leader_check.to_dict()
        if ctx.hp.commit_reveal:
            line["commitments_look"] = looked_at_commitments.summary() if looked_at_commitments is not None else None
        ctx.events.emit(line)
        log.info("window %d  val_loss %.4f (%.3f bits/byte)  aggregated %d  evaluated %s  rejected %s  %.1fs", t,
                 val_loss, line["val_bits_per_byte"],
                 len(outcome.aggregation.used), outcome.report.evaluated,
                 {u: r.reason.value for u, r in outcome.rejections.items()}, line["seconds"])
        return line

    @staticmethod
    def window_line(t: int, outcome: WindowOutcome, val_loss: float, started: float,
                    timings: dict[str, float]) -> dict[str, Any]:
        report = outcome.report.to_dict()
        return {"window": t, "val_loss": val_loss, "model_hash": outcome.aggregation.hash_after,
                "model_hash_before": outcome.aggregation.hash_before,
                "aggregated": outcome.aggregation.used, "rule": outcome.aggregation.info.rule,
                "seconds": round(time.time() - started, 2), "timings": timings,
                "rejections": {str(u): str(r.reason.value) for u, r in outcome.rejections.items()},
                "contributions": {str(u): c.score for u, c in outcome.contributions.items()},
                **{k: v for k, v in report.items() if k in (
                    "fast", "evaluated", "loss_scores", "sync_scores", "mu", "loss_ratings", "scores", "weights",
                    "top_g")}}

    # ------------------------------------------------------------- publish
    def publish_aggregate(self, agg: Aggregation) -> None:
        """The window's bundle, as soon as it exists: every other node waits for the leader's.  Validators
        that follow publish theirs (the leader's, re-encoded: the same bytes) so they can take over."""
        ctx, hp = self.ctx, self.ctx.hp
        data = encode_bundle(ctx.codec, agg.window, agg.used, agg.payloads, agg.hash_before, agg.hash_after,
                             hp.protocol_version, hp.digest(), agg.outer_before, agg.outer_after)
        put_bundle(ctx.own.client, ctx.own.bucket, data, agg.window, hp.protocol_version, ctx.run)
        self.bundle_published = time.time()

    def publish_window(self, t: int, outcome: WindowOutcome, announce: int) -> None:
        ctx, hp, v = self.ctx, self.ctx.hp, self.ctx.hp.protocol_version
        client, bucket = ctx.own.client, ctx.own.bucket
        if t % hp.windows_per_weights == 0 and self.caught_up(t):
            self.post_weights(t, outcome.report.weights)
        if (t + 1) % hp.checkpoint_every == 0:
            self.checkpoints.start(ctx.model, t + 1, hp, ctx.run, ctx.outer)
        if t % 10 == 0:
            cleanup(client, bucket, t, ctx.cfg.storage.retention_windows, ctx.run)
        if not self.leading(t):  # the list and the provenance record are the leader's
            return
        put_peers(client, bucket, PeersList(announce, v, tuple(outcome.report.top_g)), ctx.run)
        put_json(client, bucket, keys.ledger(t, v, ctx.run), outcome.record)
        try:
            ctx.chain.append_ledger(ctx.wallet, outcome.record)
        except ChainError as e:
            if e.reason != "unsupported":
                log.warning("window %d: ledger record not on chain: %s", t, e)

    def post_weights(self, t: int, weights: dict[int, float]) -> None:
        """Post the window's weights off the window loop (a real chain waits for finality), as the chain's
        rules accept them (version key, rate limit, minimum count, clipping: dso/chain/weights.py).  A window
        where nobody has a positive score posts a heartbeat instead (we stay visibly alive: the leader is a
        validator that posted lately)."""
        scores = {u: w for u, w in weights.items() if w > 0}
        if not scores:
            log.info("window %d: no peer has a positive score; posting a heartbeat", t)
            self.heartbeat()
            return
        self.last_row = scores
        self.submit_weights(scores)

    def heartbeat(self) -> None:
        """Our last real row again (a self-weight before there is one): alive, and no weight moves."""
        self.submit_weights(self.last_row or {self.ctx.uid: 1.0})

    def submit_weights(self, row: dict[int, float]) -> None:
        wallet = self.ctx.wallet
        self.writer.submit("set_weights", lambda: self.writer_chain.post_weights(wallet, row), key="set_weights")

    def on_chain_write(self, result: WriteResult) -> None:
        if self.ctx.metrics is not None:
            self.ctx.metrics.chain_write(result.kind, "ok" if result.ok else result.reason)
        if not result.ok:
            log.warning("chain write %s refused: %s %s", result.kind, result.reason, result.message)

    def save(self) -> None:
        self.book.outer = self.ctx.outer
        validator_state.save(self.ctx.state_dir, self.scores, self.ctx.model, self.book)


def main(argv: list[str] | None = None) -> int:
    cfg, _ = parse_args(argv, description=__doc__)
    return serve(cfg)


def serve(cfg: Config) -> int:
    if launched_ranks() > 1:  # started by torchrun: the ranks share each window's evaluations
        from neurons.validator_ranks import serve_ranks
        return serve_ranks(cfg)
    return Validator(build_context(cfg, "validator")).run()


def cli() -> None:
    """Console entry point ``dso-validator``."""
    run_main(main)


if __name__ == "__main__":
    cli()
