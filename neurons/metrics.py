"""A node's Prometheus metrics, derived from the one record per window it already emits (docs/operations.md).

The miner and the validator carry no instrumentation: :meth:`NodeMetrics.observe` listens to
``NodeContext.events`` and turns each per-window record into metrics.  Two things come from elsewhere:
chain writes (``neurons/metered_chain.py`` wraps the chain) and process memory (prometheus_client's
process collector).  Names follow Prometheus conventions (``dso_`` prefix, the unit in the name,
``_total`` on counters); label sets are bounded: ``uid`` by the subnet's size (uids come from the
metagraph), ``reason`` by :class:`dso.protocol.rejections.Reason`, ``step``, ``call`` and ``result`` by the short
fixed vocabularies below.
"""
from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, start_http_server

from dso.protocol.rejections import Reason

log = logging.getLogger("dso.metrics")
MAX_UID = 65535  # uids are u16 on chain; the metagraph bounds them further by the subnet's size
ROLES = ("miner", "validator")
# the step label's values (cpu: the window's CPU seconds; bundle_after_close: when the validator's bundle
# went out, after the uploads closed)
STEPS = ("train", "gather", "engine", "total", "cpu", "bundle_after_close", "encode", "upload", "wait", "apply",
         "checkpoint_wait")
# how the bundle a validator was to follow disagrees with its own gather and list (neurons/leader_check.py)
LEADER_KINDS = ("forged", "included_rejected", "differs", "unverified", "dropped", "unselected")
GATHER_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
_SHORT_CODE = re.compile(r"[a-z][a-z0-9_]{0,31}")
WindowSeconds = Callable[[int], float | None]


class NodeMetrics:
    """Every metric of one node in its own registry (several nodes may share a test process).  A role's
    metrics only: a miner exports no validation loss, a validator no training loss."""

    def __init__(self, role: str, window_seconds: WindowSeconds | None = None):
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)  # process_resident_memory_bytes, process_cpu_seconds_total, …
        self.role, self.window_seconds = role, window_seconds
        self.info = Gauge("dso_node_info", "Always 1; labels name the node", ["role", "uid", "hparams"], registry=r)
        self.window = Gauge("dso_window", "Last window this node finished", registry=r)
        self.windows = Counter("dso_windows_total", "Windows this node finished", registry=r)
        self.last_time = Gauge("dso_last_window_timestamp_seconds", "Unix time the last window finished",
                               registry=r)
        self.utilisation = Gauge("dso_utilisation_ratio", "Busy seconds ÷ window seconds (miner: training; "
                                 "validator: gathering and scoring)", registry=r)
        self.step_seconds = Gauge("dso_step_seconds", "Seconds the last window's steps took", ["step"],
                                  registry=r)
        self.sent = Counter("dso_s3_sent_bytes_total", "Bytes uploaded to S3", registry=r)
        self.received = Counter("dso_s3_received_bytes_total", "Bytes downloaded from S3", registry=r)
        self.gather_peer = Gauge("dso_gather_peer_seconds", "Seconds the last gather spent on each peer", ["uid"],
                                 registry=r)
        self.gather_hist = Histogram("dso_gather_seconds", "Seconds per peer fetch (all peers)",
                                     buckets=GATHER_BUCKETS, registry=r)
        self.chain_writes = Counter("dso_chain_writes_total", "Chain writes by call and result (ok or the "
                                    "chain's reason)", ["call", "result"], registry=r)
        # (record key of the loss in nats/token, record key of the same loss in bits/byte, their gauges): the
        # node measures bits per byte itself (dso.training.train.bits_per_byte on the bytes its tokens stand for)
        self.loss: tuple[str, str, Gauge, Gauge] | None = None
        self.peer: dict[str, Gauge] = {}
        if role == "miner":
            self.loss = ("loss", "train_bits_per_byte",
                         Gauge("dso_train_loss_nats_per_token", "Training loss of the last window", registry=r),
                         Gauge("dso_train_loss_bits_per_byte", "The same loss in bits per byte", registry=r))
            self.tokens = Counter("dso_trained_tokens_total", "Tokens trained on", registry=r)
            self.inner_steps = Gauge("dso_inner_steps", "Optimiser steps in the last window (NaN until the "
                                     "miner reports them)", registry=r)
            self.inner_steps.set(math.nan)
            self.uploads = Counter("dso_uploads_total", "Uploads by result (ok or failed)", ["result"], registry=r)
        else:
            self.loss = ("val_loss", "val_bits_per_byte",
                         Gauge("dso_validation_loss_nats_per_token", "Loss of θ on the held-out "
                               "sequences after the window's step", registry=r),
                         Gauge("dso_validation_loss_bits_per_byte", "The same loss in bits per byte", registry=r))
            self.rejections = Counter("dso_rejections_total", "Peer inputs refused, by reason", ["reason", "uid"],
                                      registry=r)
            self.aggregated = Gauge("dso_aggregated_peers", "Peers in the window's aggregate", registry=r)
            self.leader_disagreement = Gauge(
                "dso_leader_disagreement_payloads", "Payloads on which the bundle this validator was to follow "
                "disagrees with its own gather and list in the last window, by kind (0 when it leads)", ["kind"],
                registry=r)
            self.leader_refusals = Counter("dso_leader_refusals_total", "Bundles this validator refused to follow "
                                           "(a payload not signed by its miner, or one it rejected)", registry=r)
            self.peer = {key: Gauge(name, doc, ["uid"], registry=r) for key, name, doc in (
                ("weights", "dso_peer_weight_ratio", "Weight of each peer (sums to 1)"),
                ("scores", "dso_peer_score", "PeerScore = LossRating while the PoC μ passes its floor"),
                ("mu", "dso_peer_mu", "Proof-of-computation EMA μ"),
                ("loss_ratings", "dso_peer_loss_rating", "OpenSkill LossRating (μ − z·σ, z = hparams.rating_z)"))}
        self._shown: dict[str, set[str]] = {}  # per-uid gauge → uids it shows now
        self._server: Any = None

    # -------------------------------------------------------------- serving
    def serve(self, host: str, port: int) -> None:
        """Serve ``/metrics`` from a daemon thread (OSError when the port is taken)."""
        self._server, _ = start_http_server(port, addr=host, registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ------------------------------------------------------------- feeding
    def node(self, role: str, uid: int, hparams_digest: str) -> None:
        self.info.labels(role=role, uid=str(uid), hparams=hparams_digest).set(1)

    def chain_write(self, call: str, result: str) -> None:
        self.chain_writes.labels(call=call, result=result if _SHORT_CODE.fullmatch(result) else "error").inc()

    def observe(self, record: dict[str, Any]) -> None:
        """One per-window record (neurons/miner.py or neurons/validator.py) → metrics.  Fields a record lacks
        are left alone, so each role fills what it knows."""
        t = record.get("window")
        if isinstance(t, int):
            self.window.set(t)
            self.windows.inc()
        if _number(record.get("time")):
            self.last_time.set(record["time"])
        if self.loss is not None:
            for key, gauge in ((self.loss[0], self.loss[2]), (self.loss[1], self.loss[3])):
                if _number(record.get(key)):
                    gauge.set(record[key])
        for key, counter in (("bytes_up", self.sent), ("bytes_down", self.received)):
            if _number(record.get(key)) and record[key] >= 0:
                counter.inc(record[key])
        self._steps(record, t)
        self._gather(record.get("gather_seconds"))
        if self.role == "miner":
            self._miner(record)
        else:
            self._validator(record)

    def _miner(self, record: dict[str, Any]) -> None:
        if _number(record.get("tokens")) and record["tokens"] >= 0:
            self.tokens.inc(record["tokens"])
        if _number(record.get("inner_steps")):
            self.inner_steps.set(record["inner_steps"])
        if isinstance(record.get("uploaded"), bool):
            self.uploads.labels(result="ok" if record["uploaded"] else "failed").inc()

    def _validator(self, record: dict[str, Any]) -> None:
        if isinstance(record.get("aggregated"), list):
            self.aggregated.set(len(record["aggregated"]))
        found = record.get("leader")
        leader: dict[str, Any] = found if isinstance(found, dict) else {}
        for kind in LEADER_KINDS:
            count = leader.get(kind, 0)
            self.leader_disagreement.labels(kind=kind).set(count if _number(count) and count >= 0 else 0)
        if leader.get("refused") is True:
            self.leader_refusals.inc()
        for key, gauge in self.peer.items():
            if isinstance(record.get(key), dict):
                self._show(key, gauge, record[key])
        for uid, reason in (record.get("rejections") or {}).items():
            label = _uid(uid)
            if label is not None:
                self.rejections.labels(reason=_reason(reason), uid=label).inc()

    def _steps(self, record: dict[str, Any], t: Any) -> None:
        timings = dict(record.get("timings") or {})
        for step, key in (("train", "t_train"), ("total", "t_total"), ("total", "seconds")):
            if _number(record.get(key)):
                timings[step] = record[key]
        busy = timings.get("train", timings.get("total"))  # a miner is busy training, a validator all along
        for step, seconds in timings.items():
            if step in STEPS and _number(seconds):
                self.step_seconds.labels(step=step).set(seconds)
        length = self.window_seconds(t) if self.window_seconds and isinstance(t, int) else None
        if _number(record.get("utilisation")):  # a miner's own figure: training ahead counts too
            self.utilisation.set(record["utilisation"])
        elif _number(busy) and isinstance(busy, (int, float)) and isinstance(length, (int, float)) and length > 0:
            self.utilisation.set(busy / length)

    def _gather(self, seconds: Any) -> None:
        if isinstance(seconds, dict):
            self._show("gather_seconds", self.gather_peer, seconds)
            for value in seconds.values():
                if _number(value) and value >= 0:
                    self.gather_hist.observe(value)

    def _show(self, key: str, gauge: Gauge, values: dict[str, Any]) -> None:
        """Set a per-uid gauge to exactly ``values``: uids no longer present disappear."""
        now = {label: v for u, v in values.items() if (label := _uid(u)) is not None and _number(v)}
        for gone in self._shown.get(key, set()) - set(now):
            gauge.remove(gone)
        for label, value in now.items():
            gauge.labels(uid=label).set(value)
        self._shown[key] = set(now)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _uid(u: Any) -> str | None:
    try:
        uid = int(u)
    except (TypeError, ValueError):
        return None
    return str(uid) if 0 <= uid <= MAX_UID else None


def _reason(value: Any) -> str:
    try:
        return Reason(value).value
    except ValueError:
        return "other"


def start_metrics(role: str, host: str, port: int) -> NodeMetrics:
    """A node's metrics, served on ``host:port`` (OSError when the port cannot be bound)."""
    metrics = NodeMetrics(role)
    metrics.serve(host, port)
    log.info("metrics on http://%s:%d/metrics", host, port)
    return metrics

