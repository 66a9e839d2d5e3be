"""Read a node's /metrics endpoint the way Prometheus does, parsed with prometheus_client's own parser."""
from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int, host: str = "127.0.0.1") -> Samples:
    """(sample name, sorted labels) → value of every sample the endpoint serves."""
    text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def one(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    """label value → sample value of a metric with one varying label (e.g. uid)."""
    return {dict(k[1])[label]: v for k, v in samples.items() if k[0] == name and label in dict(k[1])}
