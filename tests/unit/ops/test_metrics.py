"""Prometheus metrics derived from the nodes' per-window records (neurons/metrics.py), the metered chain,
the endpoint, and the config key that turns it on.  The end-to-end scrape of real nodes is in
tests/e2e/test_network.py and tests/e2e/test_adversaries.py."""
from __future__ import annotations

import math
import socket
import urllib.request

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dso.chain import Chain, ChainError
from dso.chain.base import Neuron
from dso.config.schema import Config, ConfigError
from dso.config.sources import from_dict
from neurons.context import EventLog, _metrics
from neurons.lifecycle import Fatal
from neurons.metered_chain import MeteredChain
from neurons.metrics import NodeMetrics, start_metrics


def samples(metrics: NodeMetrics) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) → value, read back through the client's own parser."""
    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(metrics: NodeMetrics, name: str, **labels: str) -> float | None:
    return samples(metrics).get((name, tuple(sorted(labels.items()))))


def validator_record(window: int, **changes) -> dict:
    record = {"role": "validator", "uid": 0, "time": 1_700_000_000.0 + window, "window": window, "val_loss": 3.2,
              "val_bits_per_byte": 1.37,
              "aggregated": [1, 2], "seconds": 1.5,
              "timings": {"gather": 0.4, "engine": 0.9, "cpu": 1.2, "bundle_after_close": 2.1},
              "rejections": {"3": "too_late", "4": "malformed"}, "weights": {"1": 0.75, "2": 0.25, "3": 0.0},
              "scores": {"1": 0.6, "2": 0.2, "3": -0.1}, "mu": {"1": 0.3, "2": 0.1, "3": -0.2},
              "loss_ratings": {"1": 2.0, "2": 1.0, "3": -1.0}, "bytes_up": 1000, "bytes_down": 5000,
              "gather_seconds": {"1": 0.03, "2": 0.2, "3": 8.0}}
    record.update(changes)
    return record


def test_validator_records_become_metrics():
    m = NodeMetrics("validator", window_seconds=lambda t: 6.0)
    m.observe(validator_record(7))
    assert value(m, "dso_window") == 7 and value(m, "dso_windows_total") == 1
    assert value(m, "dso_validation_loss_nats_per_token") == pytest.approx(3.2)
    assert value(m, "dso_validation_loss_bits_per_byte") == pytest.approx(1.37)  # as the node measured it
    assert value(m, "dso_peer_weight_ratio", uid="1") == 0.75 and value(m, "dso_peer_score", uid="3") == -0.1
    assert value(m, "dso_peer_mu", uid="2") == 0.1 and value(m, "dso_peer_loss_rating", uid="1") == 2.0
    assert value(m, "dso_rejections_total", reason="too_late", uid="3") == 1
    assert value(m, "dso_utilisation_ratio") == pytest.approx(1.5 / 6.0)
    assert value(m, "dso_step_seconds", step="engine") == 0.9 and value(m, "dso_step_seconds", step="total") == 1.5
    assert value(m, "dso_step_seconds", step="cpu") == 1.2
    assert value(m, "dso_step_seconds", step="bundle_after_close") == 2.1
    assert value(m, "dso_gather_peer_seconds", uid="3") == 8.0
    assert value(m, "dso_gather_seconds_bucket", le="0.05") == 1 and value(m, "dso_gather_seconds_count") == 3
    assert value(m, "dso_aggregated_peers") == 2
    assert value(m, "dso_last_window_timestamp_seconds") == 1_700_000_007.0

    # next window: counters add up, uid 3 is gone from the subnet, a new reason appears
    m.observe(validator_record(8, weights={"1": 0.5, "2": 0.5}, rejections={"3": "too_late", "2": "duplicate"},
                               bytes_up=500))
    assert value(m, "dso_windows_total") == 2 and value(m, "dso_window") == 8
    assert value(m, "dso_rejections_total", reason="too_late", uid="3") == 2
    assert value(m, "dso_rejections_total", reason="duplicate", uid="2") == 1
    assert value(m, "dso_s3_sent_bytes_total") == 1500 and value(m, "dso_s3_received_bytes_total") == 10_000
    assert value(m, "dso_peer_weight_ratio", uid="3") is None       # a peer no longer weighted is no stale series
    assert value(m, "dso_peer_weight_ratio", uid="2") == 0.5


def test_the_leaders_disagreement_is_a_metric_and_each_refusal_counts():
    """A validator that does not lead records how the bundle it was to follow differs from its own gather and
    list (neurons/leader_check.py); the gauge shows the last window's counts by kind, 0 once it leads."""
    m = NodeMetrics("validator")
    m.observe(validator_record(5, leader={"source": 0, "refused": True, "forged": 1, "included_rejected": 2,
                                          "differs": 0, "unverified": 1, "dropped": 1, "unselected": 4}))
    got = {kind: value(m, "dso_leader_disagreement_payloads", kind=kind)
           for kind in ("forged", "included_rejected", "differs", "unverified", "dropped", "unselected")}
    assert got == {"forged": 1, "included_rejected": 2, "differs": 0, "unverified": 1, "dropped": 1, "unselected": 4}
    assert value(m, "dso_leader_refusals_total") == 1
    m.observe(validator_record(6, leader={"source": 2, "refused": False, "dropped": 3}))
    assert value(m, "dso_leader_disagreement_payloads", kind="dropped") == 3
    assert value(m, "dso_leader_disagreement_payloads", kind="forged") == 0
    assert value(m, "dso_leader_disagreement_payloads", kind="unselected") == 0
    m.observe(validator_record(7))  # it leads: nothing to compare
    assert value(m, "dso_leader_disagreement_payloads", kind="dropped") == 0
    assert value(m, "dso_leader_refusals_total") == 1


def test_label_sets_stay_bounded():
    m = NodeMetrics("validator")
    m.observe(validator_record(1, rejections={"5": "made_up_reason", "x": "malformed", "-1": "missing",
                                              "70000": "missing"}, weights={"not a uid": 1.0, "2": True}))
    got = samples(m)
    rejections = {dict(k[1])["uid"]: dict(k[1])["reason"] for k in got if k[0] == "dso_rejections_total"}
    assert rejections == {"5": "other"}                 # reasons come from dso.protocol.rejections.Reason; uids are u16
    assert not [k for k in got if k[0] == "dso_peer_weight_ratio"]  # a bool is no weight, a name no uid


def test_miner_records_become_metrics():
    m = NodeMetrics("miner", window_seconds=lambda t: 4.0)
    assert math.isnan(value(m, "dso_inner_steps"))     # unknown until a record carries it
    record = {"window": 3, "loss": 4.1, "uploaded": True, "bytes_up": 8000, "bytes_down": 16000, "t_train": 1.0,
              "t_total": 3.9, "tokens": 256, "train_bits_per_byte": 1.9, "aggregated": "aggregated 2/2 peers (leader)",
              "gather_seconds": {"1": 0.02, "2": 0.04},
              "timings": {"upload": 0.6, "wait": 0.3, "apply": 0.8, "cpu": 2.2}}
    m.observe(record)
    assert [value(m, "dso_step_seconds", step=s) for s in ("upload", "wait", "apply", "cpu")] == [0.6, 0.3, 0.8, 2.2]
    assert value(m, "dso_train_loss_nats_per_token") == pytest.approx(4.1)
    assert value(m, "dso_train_loss_bits_per_byte") == pytest.approx(1.9)
    assert value(m, "dso_utilisation_ratio") == pytest.approx(0.25)
    m.observe({**record, "window": 4, "uploaded": False, "tokens": 0, "loss": float("nan"), "inner_steps": 12})
    assert value(m, "dso_trained_tokens_total") == 256
    assert value(m, "dso_uploads_total", result="ok") == 1 and value(m, "dso_uploads_total", result="failed") == 1
    assert math.isnan(value(m, "dso_train_loss_nats_per_token"))   # a window without training has no loss
    assert value(m, "dso_inner_steps") == 12 and value(m, "dso_s3_received_bytes_total") == 32000


def test_each_role_exports_only_its_own_metrics():
    names = {role: {f.name for f in NodeMetrics(role).registry.collect()} for role in ("miner", "validator")}
    assert "dso_validation_loss_nats_per_token" in names["validator"] - names["miner"]
    assert {"dso_train_loss_nats_per_token", "dso_trained_tokens", "dso_inner_steps"} <= names["miner"]
    assert "dso_rejections" not in names["miner"] and "dso_peer_weight_ratio" not in names["miner"]
    for role in names:   # process memory from the client's process collector, on Linux
        assert "process_resident_memory_bytes" in names[role]
    with pytest.raises(ValueError):
        NodeMetrics("observer")


class _Chain(Chain):
    """Just enough of a chain: set_weights is refused every second call."""

    def __init__(self):
        self.calls = 0
        self.extra = "backend-specific"
        self.version_keys = []

    def block(self): return 5
    def block_timestamp(self, block): return 100.0 + block
    def randomness(self, block): return bytes(32)
    def metagraph(self, block=None): return [Neuron(0, "hk", 1.0, True, 0.0)]
    def register(self, wallet): return 0
    def commit(self, wallet, data): raise RuntimeError("socket closed")
    def commitments(self, block=None): return {}
    def weights(self): return {}

    def set_weights(self, wallet, uids, weights, version_key=None):
        self.calls += 1
        self.version_keys.append(version_key)
        if self.calls % 2 == 0:
            raise ChainError("rate_limited", "too soon")


def test_metered_chain_counts_every_write_and_changes_nothing_else():
    m = NodeMetrics("validator")
    backend = _Chain()
    chain = MeteredChain(backend, m.chain_write)
    assert chain.register(None) == 0 and chain.block() == 5 and chain.leading_validator().uid == 0
    assert chain.extra == "backend-specific"
    chain.set_weights(None, [1], [1.0])
    with pytest.raises(ChainError, match="too soon"):
        chain.set_weights(None, [1], [1.0], version_key=7)
    assert backend.version_keys == [None, 7]  # a caller's version key reaches the backend
    with pytest.raises(RuntimeError):
        chain.commit(None, "x")
    with pytest.raises(ChainError):   # the base class's answer for a backend without a ledger, still counted
        chain.append_ledger(None, {})
    assert value(m, "dso_chain_writes_total", call="set_weights", result="ok") == 1
    assert value(m, "dso_chain_writes_total", call="set_weights", result="rate_limited") == 1
    assert value(m, "dso_chain_writes_total", call="commit", result="error") == 1
    assert value(m, "dso_chain_writes_total", call="append_ledger", result="unsupported") == 1
    assert value(m, "dso_chain_writes_total", call="register", result="ok") == 1


def test_endpoint_serves_what_the_parser_reads():
    m = start_metrics("validator", "127.0.0.1", _free_port())
    try:
        m.observe(validator_record(2))
        port = m._server.server_address[1]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        m.close()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["dso_window"].samples[0].value == 2
    assert families["process_resident_memory_bytes"].samples[0].value > 10e6   # a Python process holds > 10 MB


def test_a_taken_port_is_one_clear_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        cfg = Config()
        cfg.neuron.metrics_port = taken.getsockname()[1]
        with pytest.raises(Fatal) as exc:
            _metrics(cfg, "miner")
    assert f"cannot serve metrics on 127.0.0.1:{cfg.neuron.metrics_port}" in exc.value.message
    assert _metrics(Config(), "miner") is None         # 0 = off, the default


@pytest.mark.parametrize("port", [-1, 65536])
def test_metrics_port_is_validated(port):
    with pytest.raises(ConfigError, match="neuron.metrics_port"):
        from_dict({"neuron": {"metrics_port": port}})


def test_a_failing_listener_never_stops_the_node(tmp_path):
    events = EventLog(str(tmp_path / "events.jsonl"), "miner", 3)
    seen = []
    events.listeners += [lambda r: 1 / 0, seen.append]
    events.emit({"window": 1})
    assert seen and seen[0]["uid"] == 3 and seen[0]["window"] == 1
    assert '"window": 1' in (tmp_path / "events.jsonl").read_text()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
