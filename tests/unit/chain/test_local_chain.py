"""LocalChain behaviour on a fake clock: time, registration, permits, consensus, refusals, ledger, CLI."""
from __future__ import annotations

import json
import sqlite3
from fractions import Fraction

import pytest

from chain_helpers import hk, wallets
from dso.chain.__main__ import main as cli_main
from dso.chain.base import ChainError, ChainUnavailable
from dso.chain.local import LocalChain
from dso.chain.wallets import dev_wallet, sign


# ------------------------------------------------------------------ time
def test_blocks_and_timestamps_follow_genesis_and_block_time(make_chain, clock):
    chain = make_chain(genesis=100.0, block_time=0.5)
    clock.t = 100.0 + 10.25
    assert chain.block() == 20
    assert chain.block_timestamp(20) == 110.0
    assert chain.block_timestamp(21) - chain.block_timestamp(20) == 0.5
    assert chain.block_timestamp(10**6) == 100.0 + 0.5 * 10**6  # future: the scheduled time
    clock.t = 50.0
    assert chain.block() == 0  # before genesis the chain waits at block 0
    with pytest.raises(ChainError) as e:
        chain.block_timestamp(-1)
    assert e.value.reason == "bad_input"


def test_randomness_is_fixed_once_drawn_and_unknown_for_future_blocks(make_chain, clock, tmp_path):
    chain = make_chain()
    with pytest.raises(ChainError) as e:
        chain.randomness(1001)
    assert e.value.reason == "future_block"
    r = chain.randomness(1000)
    assert len(r) == 32 and r == chain.randomness(1000) != chain.randomness(999)
    other = LocalChain.open(chain.path, clock=clock)  # another process's view of the same file
    assert other.randomness(1000) == r
    other.close()


# --------------------------------------------------- registration, permits
def test_registration_is_idempotent_and_fills_uids_in_order(make_chain):
    chain = make_chain()
    a, b = wallets("reg", 2)
    assert [chain.register(a), chain.register(b), chain.register(a)] == [0, 1, 0]
    assert [(n.uid, n.hotkey) for n in chain.metagraph()] == [(0, hk(a)), (1, hk(b))]
    assert chain.uid_of(hk(b)) == 1 and chain.uid_of(hk(dev_wallet("//nobody"))) is None


def test_validator_permits_go_to_the_largest_stakes(make_chain):
    chain = make_chain(max_validators=2, min_validator_stake=1.0)
    ws = wallets("perm", 4)
    for w, stake in zip(ws, [5.0, 10.0, 0.5, 20.0], strict=True):
        chain.register(w)
        chain.add_stake(hk(w), stake)
    assert [n.validator_permit for n in chain.metagraph()] == [False, True, False, True]
    assert chain.leading_validator().uid == 3
    assert chain.add_stake(hk(ws[3]), -15.0) == 5.0  # now 5 (uid 0) vs 5 (uid 3): lower uid wins
    assert [n.validator_permit for n in chain.metagraph()] == [True, True, False, False]
    for bad_hotkey, amount in [("not-an-address", 1.0), (hk(ws[0]), float("nan")), (hk(ws[0]), -99.0)]:
        with pytest.raises(ChainError) as e:
            chain.add_stake(bad_hotkey, amount)
        assert e.value.reason == "bad_input"


def test_full_subnet_replaces_the_lowest_incentive_non_immune_neuron(make_chain, clock):
    chain = make_chain(max_uids=3, immunity_blocks=5, min_non_immune_uids=0)
    a, b, v, c = wallets("full", 4)
    for w in (a, b, v):
        chain.register(w)
    chain.add_stake(hk(v), 10.0)
    with pytest.raises(ChainError) as e:
        chain.register(c)
    assert e.value.reason == "subnet_full" and "block 1005" in str(e.value)
    chain.set_weights(v, [0], [1.0])
    clock.advance_blocks(11)  # consensus at 1010: a gets everything; b and v tie at 0
    assert chain.register(c) == 1  # b has no incentive (v has none either, but holds a validator permit)
    assert [n.hotkey for n in chain.metagraph()] == [hk(a), hk(c), hk(v)]
    assert chain.metagraph()[1].emission == 0.0


def test_weights_set_before_a_uid_changed_hands_do_not_count(make_chain, clock):
    chain = make_chain(max_uids=3, immunity_blocks=8, min_non_immune_uids=0)
    a, b, v, c = wallets("mask", 4)
    chain.register(a)
    chain.register(b)
    clock.advance_blocks(5)
    chain.register(v)  # registered at 1005: immune until 1013
    chain.add_stake(hk(v), 10.0)
    chain.set_weights(v, [0, 1], [0.6, 0.4])
    clock.advance_blocks(6)  # 1011: a .6, b .4
    assert [n.incentive for n in chain.metagraph()] == pytest.approx([0.6, 0.4, 0.0])
    assert chain.register(c) == 1  # b has the lowest incentive among a, b (v is immune)
    clock.advance_blocks(10)  # 1021: v's old weight on uid 1 predates c's registration
    assert [n.incentive for n in chain.metagraph()] == pytest.approx([1.0, 0.0, 0.0])
    assert chain.weights() == {2: pytest.approx({0: 0.6, 1: 0.4})}  # as posted


# --------------------------------------------------------------- consensus
def test_consensus_incentive_and_emission_on_a_hand_computed_example(make_chain, clock):
    chain = make_chain(tempo=10, emission_per_block=2.0)
    validators, miners = wallets("val", 3), wallets("min", 3)
    for w in validators + miners:
        chain.register(w)
    for w, stake in zip(validators, [50, 30, 20], strict=True):
        chain.add_stake(hk(w), stake)
    clock.advance_blocks(1)
    rows = [[0.6, 0.4, 0.0], [0.5, 0.0, 0.5], [0.2, 0.3, 0.5]]
    for w, row in zip(validators, rows, strict=True):
        chain.set_weights(w, [3, 4, 5], row)
    assert chain.weights()[0] == pytest.approx({3: 0.6, 4: 0.4, 5: 0.0})
    assert all(n.incentive == 0 for n in chain.metagraph())  # no consensus has run yet
    clock.advance_blocks(10)  # block 1011: the consensus of block 1010 has run
    expected = [0, 0, 0, float(Fraction(44, 65)), float(Fraction(21, 65)), 0]
    graph = chain.metagraph()
    assert [n.incentive for n in graph] == pytest.approx(expected, abs=1e-12)
    assert [n.emission for n in graph] == pytest.approx([x * 2.0 * 10 for x in expected])
    clock.advance_blocks(30)  # three more runs with unchanged inputs
    assert [n.emission for n in chain.metagraph()] == pytest.approx([x * 2.0 * 40 for x in expected])


def test_consensus_is_the_same_whoever_computes_it(make_chain, clock):
    chain = make_chain()
    v, m = wallets("same", 2)
    chain.register(v)
    chain.register(m)
    chain.add_stake(hk(v), 5.0)
    chain.set_weights(v, [1], [1.0])
    clock.advance_blocks(35)
    other = LocalChain.open(chain.path, clock=clock)
    assert [n.emission for n in other.metagraph()] == [n.emission for n in chain.metagraph()] == [0.0, 30.0]
    other.close()


# ----------------------------------------------------------- forged writes
class Impostor:
    """Claims the victim's hotkey address but can only sign with its own key."""

    def __init__(self, victim, own):
        self.hotkey = type("Key", (), {"ss58_address": hk(victim), "sign": staticmethod(own.hotkey.sign)})()


def test_writes_in_another_hotkeys_name_are_refused(make_chain):
    chain = make_chain()
    victim, attacker, miner = wallets("forge", 3)
    for w in (victim, attacker, miner):
        chain.register(w)
    chain.add_stake(hk(victim), 10.0)
    impostor = Impostor(victim, attacker)
    for write in (lambda: chain.commit(impostor, "evil"), lambda: chain.set_weights(impostor, [2], [1.0]),
                  lambda: chain.append_ledger(impostor, {"evil": True})):
        with pytest.raises(ChainError) as e:
            write()
        assert e.value.reason == "bad_signature" and hk(victim) in str(e.value)
    assert chain.commitments() == {} and chain.weights() == {} and chain.ledger() == []


def test_unregistered_and_non_validator_writes_are_refused(make_chain):
    chain = make_chain()
    member, stranger = wallets("member", 2)
    chain.register(member)
    for write in (lambda: chain.commit(stranger, "x"), lambda: chain.set_weights(stranger, [0], [1.0]),
                  lambda: chain.append_ledger(stranger, {"x": 1})):
        with pytest.raises(ChainError) as e:
            write()
        assert e.value.reason == "not_registered"
    with pytest.raises(ChainError) as e:
        chain.set_weights(member, [0], [1.0])
    assert e.value.reason == "no_permit" and "stake 0" in str(e.value)


def test_rows_written_into_the_file_directly_are_ignored_on_read(make_chain, clock):
    chain = make_chain()
    victim, attacker, newcomer = wallets("direct", 3)
    chain.register(victim)
    chain.add_stake(hk(victim), 10.0)
    chain.commit(victim, "honest")
    chain.set_weights(victim, [0], [1.0])
    clock.advance_blocks(1)
    db = sqlite3.connect(chain.path)
    bogus = sign(attacker, b"anything")
    db.execute("INSERT INTO commitments (hotkey, block, data, signature) VALUES (?, 1001, 'forged', ?)",
               (hk(victim), bogus))
    honest_sig = db.execute("SELECT signature FROM commitments WHERE data = 'honest'").fetchone()[0]
    db.execute("INSERT INTO commitments (hotkey, block, data, signature) VALUES (?, 1001, 'replayed', ?)",
               (hk(victim), honest_sig))  # a real signature moved onto other content
    db.execute("INSERT INTO weights (hotkey, block, uids, weights, signature) VALUES (?, 1001, '[1]', '[1.0]', ?)",
               (hk(victim), bogus))
    db.execute("INSERT INTO registrations (uid, hotkey, block, signature) VALUES (1, ?, 1001, ?)",
               (hk(newcomer), bogus))
    db.commit()
    db.close()
    assert chain.commitments() == {0: "honest"}
    assert chain.weights() == {0: {0: 1.0}}
    assert [n.hotkey for n in chain.metagraph()] == [hk(victim)]


# ------------------------------------------------------------ bad input
def test_commitment_limits_and_rate_limit(make_chain, clock):
    chain = make_chain(commit_interval_blocks=5, commit_max_bytes=64)
    (miner,) = wallets("commit", 1)
    chain.register(miner)
    chain.commit(miner, "first")
    chain.commit(miner, "first")  # unchanged: a no-op, not a rate-limit violation
    with pytest.raises(ChainError) as e:
        chain.commit(miner, "second")
    assert e.value.reason == "rate_limited" and "block 1005" in str(e.value)
    for bad, reason in [("x" * 65, "too_large"), ("line\nbreak", "bad_commitment"), ("", "bad_commitment"),
                        (b"bytes", "bad_commitment"), ("caf\u00e9", "bad_commitment")]:
        with pytest.raises(ChainError) as e:
            chain.commit(miner, bad)
        assert e.value.reason == reason and str(e.value)
    clock.advance_blocks(5)
    chain.commit(miner, "second")
    assert chain.commitments() == {0: "second"}


def test_bad_weights_are_refused_and_nothing_is_stored(make_chain):
    chain = make_chain()
    v, m = wallets("badw", 2)
    chain.register(v)
    chain.register(m)
    chain.add_stake(hk(v), 10.0)
    for uids, weights, reason in [([1], [float("nan")], "bad_weights"), ([1], [-1.0], "bad_weights"),
                                  ([0, 1], [1.0], "bad_weights"), ([7], [1.0], "bad_weights"),
                                  ([1], [0.0], "bad_weights")]:
        with pytest.raises(ChainError) as e:
            chain.set_weights(v, uids, weights)
        assert e.value.reason == reason
    assert chain.weights() == {}


# ----------------------------------------------------------------- ledger
def test_ledger_links_records_and_reports_tampering(make_chain):
    chain = make_chain()
    a, b = wallets("ledger", 2)
    chain.register(a)
    chain.register(b)
    h0 = chain.append_ledger(a, {"window": 0, "model": "aa"})
    h1 = chain.append_ledger(b, {"window": 1, "model": "bb", "scores": [0.5, 1e-3]})
    records = chain.ledger()
    assert [(r["seq"], r["prev_hash"], r["hash"]) for r in records] == [(0, "0" * 64, h0), (1, h0, h1)]
    assert records[1]["record"] == {"window": 1, "model": "bb", "scores": [0.5, 1e-3]}
    assert chain.verify_ledger() == []
    for bad, reason in [([1, 2], "bad_record"), ({"x": float("nan")}, "bad_record"),
                        ({"x": object()}, "bad_record"), ({"x": "y" * 300_000}, "too_large")]:
        with pytest.raises(ChainError) as e:
            chain.append_ledger(a, bad)
        assert e.value.reason == reason
    db = sqlite3.connect(chain.path)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        db.execute("UPDATE ledger SET record = '{}' WHERE seq = 0")
    db.execute("DROP TRIGGER ledger_no_update")
    db.execute("UPDATE ledger SET record = ? WHERE seq = 0", (json.dumps({"window": 0, "model": "zz"}),))
    db.commit()
    db.close()
    problems = chain.verify_ledger()
    assert len(problems) == 1 and "seq 0" in problems[0] and "hash" in problems[0]
    assert [r["seq"] for r in chain.ledger()] == [1]


# ------------------------------------------------------- files and the CLI
def test_missing_corrupt_and_duplicate_chain_files(make_chain, tmp_path, clock):
    with pytest.raises(ChainUnavailable) as e:
        LocalChain.open(tmp_path / "absent.sqlite")
    assert "scripts/localnet.py" in str(e.value)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(ChainUnavailable):
        LocalChain.open(junk)
    chain = make_chain(tempo=7)
    with pytest.raises(ChainError) as e:
        LocalChain.create(chain.path)
    assert e.value.reason == "exists"
    again = LocalChain.create(chain.path, exist_ok=True, tempo=99, clock=clock)
    assert again.params.tempo == 7 and again.chain_id == chain.chain_id
    again.close()
    for bad in ({"tempo": 0}, {"tempo": 2.5}, {"kappa": 1.0}, {"block_time": float("nan")}, {"no_such_setting": 1}):
        with pytest.raises(ChainError) as e:
            LocalChain.create(tmp_path / "bad.sqlite", **bad)
        assert e.value.reason == "bad_input"
    assert not (tmp_path / "bad.sqlite").exists()


def test_status_cli_prints_metagraph_weights_and_ledger(make_chain, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    chain = make_chain()
    v, m = wallets("cli", 2)
    chain.register(v)
    chain.register(m)
    chain.add_stake(hk(v), 3.0)
    chain.set_weights(v, [1], [1.0])
    chain.commit(m, "dso1|endpoint")
    chain.append_ledger(v, {"window": 1})
    assert cli_main(["status", "--path", str(chain.path)]) == 0
    out = capsys.readouterr().out
    assert hk(v)[:6] in out and "dso1|endpoint" in out and "1:1.000" in out
    assert "ledger: 1 records, hash chain intact" in out
    assert cli_main(["status", "--path", str(chain.path) + ".absent"]) == 1
    assert "scripts/localnet.py" in capsys.readouterr().err


def test_rows_of_the_wrong_type_in_the_file_do_not_break_reads(make_chain):
    chain = make_chain()
    (member,) = wallets("types", 1)
    chain.register(member)
    db = sqlite3.connect(chain.path)
    db.execute("INSERT INTO registrations (uid, hotkey, block, signature) VALUES ('x', 5, 10, x'01')")
    db.execute("INSERT INTO commitments (hotkey, block, data, signature) VALUES (?, 'late', 7, x'00')", (hk(member),))
    db.execute("INSERT INTO weights (hotkey, block, uids, weights, signature) VALUES (?, 999, '{', 'nan', 1)",
               (hk(member),))
    db.commit()
    db.close()
    assert [n.hotkey for n in chain.metagraph()] == [hk(member)]
    assert chain.commitments() == {} and chain.weights() == {}
