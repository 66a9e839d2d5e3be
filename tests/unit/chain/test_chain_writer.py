"""Chain writes off the window loop (ChainWriter) and per-window read caching (CachedChain)."""
from __future__ import annotations

import json
import threading

import pytest

from chain_helpers import hk, wallets
from dso.chain.base import ChainError
from dso.chain.cached import CachedChain
from dso.chain.writer import ChainWriter


def test_writes_run_in_order_off_the_callers_thread_and_are_logged(tmp_path):
    gate, seen = threading.Event(), []
    writer = ChainWriter(log_path=tmp_path / "writes.jsonl")

    def slow():
        gate.wait(5)  # like waiting for finality
        seen.append(("slow", threading.current_thread().name))

    first = writer.submit("commit", slow)
    second = writer.submit("commit", lambda: seen.append(("fast", threading.current_thread().name)) or 42)
    assert seen == []  # submit returned at once
    gate.set()
    assert writer.wait(5)
    assert [s[0] for s in seen] == ["slow", "fast"] and {s[1] for s in seen} == {"chain-writer"}
    assert writer.result(first).ok and writer.result(second).value == 42
    logged = [json.loads(line) for line in (tmp_path / "writes.jsonl").read_text().splitlines()]
    assert [(r["ticket"], r["ok"]) for r in logged] == [(1, True), (2, True)] and "value" not in logged[0]
    writer.close()


def test_refusals_and_crashes_are_reported_and_the_writer_goes_on():
    results = []
    writer = ChainWriter(on_result=results.append)

    def refused():
        raise ChainError("rate_limited", "next allowed at block 1100")
    writer.submit("set_weights", refused)
    writer.submit("set_weights", lambda: 1 / 0)
    writer.submit("commit", lambda: "fine")
    assert writer.wait(5)
    assert [(r.ok, r.reason) for r in results] == [(False, "rate_limited"), (False, "error"), (True, "")]
    assert "block 1100" in results[0].message and "ZeroDivisionError" in results[1].message
    writer.close()


def test_a_newer_post_supersedes_a_waiting_one_and_a_full_queue_drops_the_oldest():
    gate, started = threading.Event(), threading.Event()
    writer = ChainWriter(max_pending=2)
    busy = writer.submit("block", lambda: started.set() or gate.wait(5))
    assert started.wait(5)  # the writer is inside the first write: the rest wait in the queue
    old = writer.submit("set_weights", lambda: "old", key="set_weights")
    new = writer.submit("set_weights", lambda: "new", key="set_weights")
    a = writer.submit("commit", lambda: "a")
    b = writer.submit("commit", lambda: "b")  # queue full (new, a): drops new
    gate.set()
    assert writer.wait(5)
    outcome = {t.id: (writer.result(t).ok, writer.result(t).reason) for t in (busy, old, new, a, b)}
    assert outcome == {busy.id: (True, ""), old.id: (False, "superseded"), new.id: (False, "dropped"),
                       a.id: (True, ""), b.id: (True, "")}
    writer.close()
    with pytest.raises(RuntimeError):
        writer.submit("commit", lambda: None)


def test_set_weights_through_the_writer_on_a_local_chain(make_chain):
    chain = make_chain(weights_rate_limit=100)
    v, m = wallets("writer", 2)
    chain.register(v)
    chain.register(m)
    chain.add_stake(hk(v), 5.0)
    writer = ChainWriter()
    ok = writer.set_weights(chain, v, [1], [1.0])
    assert writer.wait(5)
    refused = writer.set_weights(chain, v, [1], [1.0])
    assert writer.wait(5)
    assert writer.result(ok).ok and writer.result(refused).reason == "rate_limited"
    writer.close()


class Counting:
    """Counts reads of an inner chain."""

    def __init__(self, inner):
        self.inner, self.calls = inner, {}

    def __getattr__(self, name):
        target = getattr(self.inner, name)
        if not callable(target):
            return target

        def call(*a, **kw):
            self.calls[name] = self.calls.get(name, 0) + 1
            return target(*a, **kw)
        return call


def test_reads_are_cached_per_window_and_dropped_on_writes(make_chain, clock):
    chain = make_chain()
    v, m = wallets("cache", 2)
    chain.register(v)
    chain.add_stake(hk(v), 5.0)
    inner = Counting(chain)
    cached = CachedChain(inner)
    cached.begin_window(1)
    for _ in range(5):
        cached.leading_validator(), cached.metagraph(), cached.uid_of(hk(v)), cached.protocol_validators()
    assert inner.calls.get("metagraph") == 1 and inner.calls.get("commitments") == 1
    cached.register(m)  # a write through the cache: the next read sees it
    assert len(cached.metagraph()) == 2 and inner.calls["metagraph"] == 2
    chain.register(wallets("cache-other", 1)[0])  # a write by someone else: seen from the next window
    assert len(cached.metagraph()) == 2
    cached.begin_window(2)
    assert len(cached.metagraph()) == 3
    r = cached.randomness(1000)
    assert cached.randomness(1000) == r and inner.calls["randomness"] == 1  # a produced block's fact: for good
    assert cached.weights_version == chain.weights_version


def test_a_forgotten_window_expires_after_max_age(make_chain):
    chain = make_chain()
    now = [0.0]
    inner = Counting(chain)
    cached = CachedChain(inner, max_age_seconds=10, clock=lambda: now[0])
    cached.metagraph()
    now[0] = 9.0
    cached.metagraph()
    now[0] = 20.0
    cached.metagraph()
    assert inner.calls["metagraph"] == 2
