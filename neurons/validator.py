#!/usr/bin/env python
"""DSO validator: scores every peer each window (Gauntlet), advances θ, posts weights.

    python neurons/validator.py [--wallet.name W --wallet.hotkey H] [flags]

Each window t, after its put window closes (DESIGN §6; with commit-reveal, after
the reveal window that follows it): gather all active peers' payloads (strict
checks, per-peer deadline; commitments) → copy detection → fast
checks on F_t ⊇ top-G, primary evaluation on S_t, OpenSkill, μ → weights →
apply the signed aggregate of the top-G list announced for t → publish the
aggregate, the top-G list for window t+2, the provenance record and (every N
windows) a checkpoint → post weights.  State is saved after every window; a restart
continues exactly where it stopped.  Nothing a peer sends can stop it: every
bad input is a logged rejection.  ``--help`` lists every flag.
"""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dso.aggregation import signed_step  # noqa: E402
from dso.contribution import round_contributions  # noqa: E402
from dso.robust import decoded_rows, robust_delta  # noqa: E402
from dso.chain import ChainError  # noqa: E402
from dso.config import parse_args  # noqa: E402
from dso.model import model_hash  # noqa: E402
from dso.provenance import make_record, record_hash  # noqa: E402
from dso.train import evaluate, learning_rate  # noqa: E402
from neurons import validator_state  # noqa: E402
from neurons.follow import Follower  # noqa: E402
from neurons.node import Fatal, Node, run_main  # noqa: E402
from neurons.reveal import settings_problem  # noqa: E402
from scoring import state as scoring_state  # noqa: E402
from scoring.copies import assigned_gains, find_copies  # noqa: E402
from scoring.evaluation import ParameterSnapshot  # noqa: E402
from scoring.window import score_window  # noqa: E402
from storage import keys  # noqa: E402
from storage.aggregate import encode_aggregate, put_aggregate  # noqa: E402
from storage.checkpoint import save_checkpoint  # noqa: E402
from storage.cleanup import cleanup  # noqa: E402
from storage.client import StorageError  # noqa: E402
from storage.jsonobj import put_json  # noqa: E402
from storage.peers import PeersList, put_peers  # noqa: E402
from storage.reveal import gather_window  # noqa: E402
from storage.wire import Expect  # noqa: E402

log = logging.getLogger("dso.validator")
SETTLE_SECONDS = 1.5   # after the put window closes, before gathering: S3 LastModified has 1 s resolution,
                       # so an upload is provably late only once it lands > 1 s after the close
LIST_LEAD = 2          # the top-G list scored in window t governs window t + 2: a full window of slack


class Validator(Node):
    role = "validator"

    def __init__(self, cfg, publish: bool = True):
        super().__init__(cfg)
        problem = settings_problem(self.hp)
        if problem:
            raise Fatal(problem)
        self.publish = publish  # False: compute only (used to check a restart against an uninterrupted run)
        self.val_batch = self.dataset.validation(self.hp.val_sequences)
        try:
            loaded = validator_state.load(self.state_dir, self.model, self.hp.digest())
        except scoring_state.StateError as e:
            raise Fatal(f"saved state does not fit this run: {e} (move {self.state_dir} away to start fresh)")
        self.fresh = loaded is None
        if loaded:
            self.scores, self.book = loaded
            log.info("resumed at window %d (model %s…)", self.book.model_window, model_hash(self.model)[:10])
        else:
            self.scores = scoring_state.ValidatorState.new(self.hp.digest())
            self.book = validator_state.Bookkeeping(self.clock.current_window())
        self.follower = Follower(self, self.model)

    # ----------------------------------------------------------------- loop
    def leading(self) -> bool:
        return self.leader_uid() in (None, self.uid)

    def run(self) -> int:
        if not self.leading():
            self.check_manifest()
        if self.fresh:
            self.genesis()
        done = 0
        while not self.stop():
            t = self.book.model_window
            if not self.clock.sleep_until(self.clock.uploads_close(t, self.hp.commit_reveal) + SETTLE_SECONDS,
                                          self.stop):
                break
            try:
                self.process(t)
            except (ChainError, StorageError) as e:  # infrastructure, not peers: retry the window shortly
                log.warning("window %d: %s; retrying", t, e)
                self.stop.sleep(2.0)
                continue
            done += 1
            if self.cfg.neuron.max_windows and done >= self.cfg.neuron.max_windows:
                break
        log.info("stopped at window %d", self.book.model_window)
        return 0

    def genesis(self) -> None:
        """First start: θ_w = θ_0 for the current window w; publish what joining miners need."""
        t = self.book.model_window
        for w in range(t, t + LIST_LEAD):  # lists are announced LIST_LEAD windows ahead: the first ones are cold
            self.book.lists[w] = self.active_uids()[: self.hp.topg]
        if self.publish and self.leading():
            self.publish_manifest()
            save_checkpoint(self.client, self.bucket, self.model, t, self.hp)
            for w in range(t, t + LIST_LEAD):
                put_peers(self.client, self.bucket, PeersList(w, self.hp.protocol_version, self.book.lists[w]))
        self.save()
        log.info("genesis at window %d with %d peers", t, len(self.book.lists[t]))

    def active_uids(self) -> list[int]:
        """Peers to score: every registered uid except validators (permit holders) and ourselves."""
        return [n.uid for n in self.chain.metagraph() if n.uid != self.uid and not n.validator_permit]

    # -------------------------------------------------------------- window
    def process(self, t: int) -> dict:
        started = time.time()
        timings: dict[str, float] = {}
        mark = [time.perf_counter()]

        def lap(name: str) -> None:
            now = time.perf_counter()
            timings[name] = round(now - mark[0], 3)
            mark[0] = now

        hp, put = self.hp, self.clock.put_window(t)
        metagraph = {n.uid: n.hotkey for n in self.chain.metagraph()
                     if n.uid != self.uid and not n.validator_permit}
        buckets = self.buckets()
        self.codec.set_window(t)
        got = gather_window(t, {u: buckets.get(u) for u in metagraph}, self.codec, Expect.from_hparams(hp, t), put,
                            self.cfg.storage.gather_deadline_seconds, commit_reveal=hp.commit_reveal,
                            readers=self.readers)
        updates = {u: p.update for u, p in got.payloads.items()}
        lap("gather")
        lr = learning_rate(hp, t)
        rejections = dict(got.rejections)
        rejections.update(find_copies(self.codec, updates, {u: p.last_modified for u, p in got.payloads.items()},
                                      assigned_gains(self.model, self.codec, self.dataset, hp, t, hp.eval_scale * lr,
                                                     updates)))
        payloads = {u: (p.update, p.sync_values) for u, p in got.payloads.items() if u not in rejections}
        lap("copies")

        # 1. the aggregate first — it depends only on the list announced for t and the payloads that passed the
        #    transport checks (what miners can verify themselves), so followers need not wait for the scoring
        in_list = self.book.lists.get(t, []) if self.leading() else \
            self.follower.peers_list(t, self.clock.uploads_close(t, hp.commit_reveal) + SETTLE_SECONDS + 3.0)[0]
        used = [u for u in in_list if u in got.payloads]
        delta, info = robust_delta(self.codec, [got.payloads[u].update for u in used], hp, used, self.device)
        signs = {n: torch.sign(d) for n, d in delta.items()}
        theta_t = ParameterSnapshot(self.model)
        before = model_hash(self.model)
        signed_step(self.model, signs, lr, hp.weight_decay)
        after = model_hash(self.model)
        theta_next = ParameterSnapshot(self.model)
        if self.publish and self.leading():
            data = encode_aggregate(signs, t, before, after, lr, hp.protocol_version, hp.digest())
            put_aggregate(self.client, self.bucket, data, t, hp.protocol_version)
        lap("aggregate")

        # 2. score window t at θ_t
        theta_t.restore()
        report = score_window(self.scores, self.model, self.codec, self.dataset, hp, t, payloads, rejections,
                              metagraph, self.clock.window_randomness(t))
        theta_next.restore()
        del theta_t, theta_next
        lap("score")
        announce = t + LIST_LEAD
        self.book.lists[announce] = report.top_g
        self.book.lists = {w: l for w, l in self.book.lists.items() if w > t}
        if self.publish and self.leading():
            put_peers(self.client, self.bucket, PeersList(announce, hp.protocol_version, report.top_g))

        # 3. record, post, save
        contributions = self.contributions(updates, delta, report)
        lap("contributions")
        record = make_record(t, before, after, [{"uid": u, "score": report.scores.get(u, 0.0),
                                                 "weight": report.weights.get(u, 0.0),
                                                 "contribution": contributions[u].score} for u in used],
                             self.book.ledger_hash, self.hotkey, extra={"rule": info.rule})
        self.book.ledger_hash = record_hash(record)
        if self.publish:
            self.publish_window(t, report, record)
        self.book.model_window = t + 1
        lap("publish")
        val_loss = evaluate(self.model, self.val_batch, hp.micro_batch, self.device)
        lap("val_loss")
        self.save()
        lap("save")
        line = {"window": t, "val_loss": val_loss, "model_hash": after, "aggregated": used,
                "rule": info.rule, "seconds": round(time.time() - started, 2), "timings": timings,
                "rejections": {str(u): str(r.reason.value) for u, r in rejections.items()},
                "contributions": {str(u): c.score for u, c in contributions.items()},
                **{k: v for k, v in report.to_dict().items() if k in (
                    "fast", "evaluated", "loss_scores", "sync_scores", "mu", "loss_ratings", "scores", "weights",
                    "top_g")}}
        self.emit(line)
        log.info("window %d  val_loss %.4f  aggregated %d  evaluated %s  rejected %s  %.1fs", t, val_loss, len(used),
                 report.evaluated, {u: r.reason.value for u, r in rejections.items()}, line["seconds"])
        return line

    def contributions(self, updates: dict, delta: dict, report) -> dict:
        """ZIP-400 contribution of every peer whose update was read this window."""
        uids = sorted(updates)
        if not uids:
            return {}
        rows = decoded_rows(self.codec, [updates[u] for u in uids], self.device)
        aggregate = torch.cat([delta[n].reshape(-1) for n in self.codec.shapes])
        return round_contributions(dict(zip(uids, rows)), aggregate, report.mu, report.loss_scores)

    def publish_window(self, t, report, record) -> None:
        hp, v = self.hp, self.hp.protocol_version
        if t % hp.windows_per_weights == 0:
            self.post_weights(t, report.weights)
        if not self.leading():  # miners follow the leader's objects only
            return
        put_json(self.client, self.bucket, keys.ledger(t, v), record)
        try:
            self.chain.append_ledger(self.wallet, record)
        except ChainError as e:
            if e.reason != "unsupported":
                log.warning("window %d: ledger record not on chain: %s", t, e)
        if (t + 1) % hp.checkpoint_every == 0:
            save_checkpoint(self.client, self.bucket, self.model, t + 1, hp)
        if t % 10 == 0:
            cleanup(self.client, self.bucket, t, self.cfg.storage.retention_windows)

    def post_weights(self, t: int, weights: dict[int, float]) -> None:
        uids = sorted(u for u, w in weights.items() if w > 0)
        if not uids:
            log.info("window %d: no peer has a positive score yet; no weights posted", t)
            return
        try:
            self.chain.set_weights(self.wallet, uids, [weights[u] for u in uids])
        except ChainError as e:
            log.warning("window %d: weights refused: %s", t, e)

    def save(self) -> None:
        validator_state.save(self.state_dir, self.scores, self.model, self.book)


def main(argv: list[str] | None = None) -> int:
    cfg, _ = parse_args(argv, description=__doc__)
    return Validator(cfg).run()


if __name__ == "__main__":
    run_main(main)
