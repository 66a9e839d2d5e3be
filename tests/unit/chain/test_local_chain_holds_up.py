"""The local chain holds up under churn.  Each test failed before the change:
a sybil flood evicted a new honest miner before it could earn; deregistered rows were kept for ever;
every read re-built and re-checked every row's signature."""
from __future__ import annotations

import sqlite3

from chain_helpers import hk, wallets
from dso.chain import local_state
from dso.chain.base import STATE_HISTORY_BLOCKS, ChainError
from dso.chain.local import LocalChain
from dso.chain.wallets import dev_wallet

WINDOW_BLOCKS = 12       # the default hparams.blocks_per_window
WINDOWS_TO_EARN = 20     # windows an honest miner needs before its mu, then its weight, turns positive


def test_a_sybil_flood_does_not_evict_a_new_honest_miner_before_it_earns(make_chain, clock):
    """Default parameters.  A validator and an honest miner join a small subnet; from the next block on
    an attacker registers a fresh hotkey every block.  The validator's weight reaches the miner only
    after WINDOWS_TO_EARN windows; the miner must still hold its uid then, and earn."""
    chain = make_chain(max_uids=8)
    validator, honest = wallets("flood", 2)
    chain.register(validator)
    chain.add_stake(hk(validator), 100.0)
    honest_uid = chain.register(honest)
    earn_at = chain.block() + WINDOWS_TO_EARN * WINDOW_BLOCKS
    refused = 0
    for i in range(earn_at - chain.block() + 3 * 10):
        clock.advance_blocks(1)
        try:
            chain.register(dev_wallet(f"//sybil{i}"))
        except ChainError as e:
            assert e.reason == "subnet_full", e
            refused += 1
        if chain.block() == earn_at:
            assert chain.uid_of(hk(honest)) == honest_uid, "the honest miner was evicted before it could earn"
            chain.set_weights(validator, [honest_uid], [1.0])
    assert chain.uid_of(hk(honest)) == honest_uid
    assert next(n for n in chain.metagraph() if n.uid == honest_uid).incentive == 1.0
    assert refused > 0  # the flood met a full subnet of immune neurons


def test_deregistered_rows_are_pruned_and_the_state_is_unchanged(make_chain, clock):
    chain = make_chain(max_uids=4, immunity_blocks=0, min_non_immune_uids=0)
    churn = wallets("churn", 60)
    for w in churn:
        chain.register(w)
        clock.advance_blocks(1)
    clock.advance_blocks(STATE_HISTORY_BLOCKS + 20)  # past the kept history and two consensus runs
    graph = chain.metagraph()
    assert sorted(n.hotkey for n in graph) == sorted(hk(w) for w in churn[-4:])
    with sqlite3.connect(chain.path) as db:
        (rows,) = db.execute("SELECT COUNT(*) FROM registrations").fetchone()
    assert rows == 4  # one live row per uid; before: all 60 were kept
    other = LocalChain.open(chain.path, clock=clock)  # a fresh process reads the same state
    assert [(n.uid, n.hotkey) for n in other.metagraph()] == [(n.uid, n.hotkey) for n in graph]
    other.close()


def test_weights_of_deregistered_validators_are_pruned(make_chain, clock):
    chain = make_chain(max_uids=3, immunity_blocks=0, min_non_immune_uids=0)
    v, m = wallets("gone", 2)
    chain.register(v)
    chain.register(m)
    chain.add_stake(hk(v), 10.0)
    chain.set_weights(v, [1], [1.0])
    clock.advance_blocks(1)
    chain.register(dev_wallet("//newcomer0"))
    clock.advance_blocks(1)
    chain.add_stake(hk(v), -10.0)  # a permit holder is never evicted: the validator unstakes first
    chain.register(dev_wallet("//newcomer1"))  # evicts the former validator (no incentive, oldest)
    assert chain.uid_of(hk(v)) is None
    clock.advance_blocks(STATE_HISTORY_BLOCKS + 20)
    chain.metagraph()
    with sqlite3.connect(chain.path) as db:
        assert db.execute("SELECT COUNT(*) FROM weights WHERE hotkey = ?", (hk(v),)).fetchone() == (0,)


def test_each_row_is_verified_once_and_an_edited_row_again(make_chain, clock, monkeypatch):
    chain = make_chain(tempo=1000)
    ws = wallets("once", 30)
    for w in ws:
        chain.register(w)
    chain.add_stake(hk(ws[0]), 10.0)
    chain.set_weights(ws[0], list(range(1, 30)), [1.0] * 29)
    for w in ws[:10]:
        chain.commit(w, f"commitment of {hk(w)[:8]}")
    chain.metagraph(), chain.commitments(), chain.weights()  # first reads: every row checked once
    calls = {"verify": 0, "message": 0}
    real_verify, real_message = local_state.verify, LocalChain._message

    def counting_verify(*a):
        calls["verify"] += 1
        return real_verify(*a)

    def counting_message(self, *a, **kw):
        calls["message"] += 1
        return real_message(self, *a, **kw)
    monkeypatch.setattr(local_state, "verify", counting_verify)
    monkeypatch.setattr(LocalChain, "_message", counting_message)
    for _ in range(3):
        graph = chain.metagraph()
        chain.commitments(), chain.weights()
    assert calls == {"verify": 0, "message": 0}, calls  # before: 30+ of each per read
    assert len(graph) == 30
    with sqlite3.connect(chain.path) as db:  # a writer with file access moves uid 5's row to uid 200
        db.execute("UPDATE registrations SET uid = 200 WHERE hotkey = ?", (hk(ws[5]),))
    assert chain.uid_of(hk(ws[5])) is None and calls["verify"] == 1  # the edited row: checked, and refused
