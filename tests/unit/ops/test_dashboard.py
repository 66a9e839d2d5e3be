"""The Grafana dashboard in docs/grafana/ reads only what the nodes export: every metric and label its PromQL
names exists in neurons/metrics.py (fed one record of each role), and it covers what an operator watches."""
from __future__ import annotations

import json
import re

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from neurons.metrics import NodeMetrics
from repo import ROOT

DASHBOARD = ROOT / "docs" / "grafana" / "dso-dashboard.json"
FUNCTIONS = {"sum", "max", "min", "avg", "count", "topk", "bottomk", "rate", "increase", "irate",
             "histogram_quantile", "time", "by", "without", "on", "ignoring", "and", "or", "unless", "offset"}
TARGET_LABELS = {"instance", "job", "node", "behaviour"}   # Prometheus adds these per target (sim/localnet.py)


def exported() -> tuple[set[str], set[str]]:
    """Sample names and label names the nodes export, after one record of each role."""
    names, labels = set(), set()
    for role, record in (("miner", {"window": 1, "loss": 4.0, "tokens": 10, "uploaded": True, "bytes_up": 1,
                                    "bytes_down": 1, "t_train": 1.0, "t_total": 4.0, "gather_seconds": {"1": 0.1},
                                    "inner_steps": 3}),
                         ("validator", {"window": 1, "val_loss": 4.0, "aggregated": [1], "seconds": 1.0,
                                        "timings": {"gather": 0.5}, "rejections": {"2": "too_late"},
                                        "weights": {"1": 1.0}, "scores": {"1": 1.0}, "mu": {"1": 1.0},
                                        "loss_ratings": {"1": 1.0}, "gather_seconds": {"1": 0.1}})):
        m = NodeMetrics(role, window_seconds=lambda t: 4.0)
        m.node(role, 0, "digest")
        m.chain_write("set_weights", "ok")
        m.observe(record)
        for family in text_string_to_metric_families(generate_latest(m.registry).decode()):
            for s in family.samples:
                names.add(s.name)
                labels |= set(s.labels)
    return names, labels


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def queries(dashboard: dict) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard["panels"] if p["type"] != "row" for t in p["targets"]]


def test_dashboard_is_an_importable_grafana_dashboard(dashboard):
    assert dashboard["title"] and dashboard["uid"] and dashboard["schemaVersion"] >= 30
    assert [i["pluginId"] for i in dashboard["__inputs"]] == ["prometheus"]   # asks for the data source on import
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for p in dashboard["panels"]:
        assert {"h", "w", "x", "y"} <= set(p["gridPos"]) and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]
        if p["type"] != "row":
            assert p["targets"] and p["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]


def problems(dashboard: dict, names: set[str], labels: set[str]) -> list[str]:
    """What in the dashboard's PromQL the nodes do not export (metric names, label names)."""
    found = []
    for title, expr in queries(dashboard):
        unquoted = re.sub(r'"[^"]*"', '""', expr)
        grouped = {x.strip() for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", unquoted)
                   for x in group.split(",")}
        matched = set(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", unquoted))
        tokens = set(re.findall(r"[a-zA-Z_:][\w:]*", re.sub(r"\[[^\]]*\]", "", unquoted)))
        metrics = tokens - FUNCTIONS - grouped - matched
        if not metrics:
            found.append(f"{title}: no metric in {expr!r}")
        found += [f"{title}: metric {m} is not exported" for m in sorted(metrics - names)]
        found += [f"{title}: label {x} is not exported" for x in sorted((grouped | matched) - labels - TARGET_LABELS)]
    return found


def test_every_query_names_only_exported_metrics_and_labels(dashboard):
    assert problems(dashboard, *exported()) == []


def test_the_checker_catches_a_renamed_metric_or_label(dashboard):
    broken = json.loads(json.dumps(dashboard))
    target = next(p for p in broken["panels"] if p["title"] == "Rejections by reason")["targets"][0]
    target["expr"] = target["expr"].replace("dso_rejections_total", "dso_rejected_total").replace("reason", "why")
    assert problems(broken, *exported()) == ["Rejections by reason: metric dso_rejected_total is not exported",
                                             "Rejections by reason: label why is not exported"]


def test_dashboard_covers_what_an_operator_watches(dashboard):
    exprs = " ".join(expr for _, expr in queries(dashboard))
    for metric in ("dso_validation_loss_bits_per_byte", "dso_peer_weight_ratio", "dso_rejections_total",
                   "dso_s3_sent_bytes_total", "dso_s3_received_bytes_total", "dso_gather_seconds_bucket",
                   "dso_chain_writes_total", "dso_utilisation_ratio", "process_resident_memory_bytes"):
        assert metric in exprs, metric
