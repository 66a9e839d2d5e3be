"""Registration on the local chain costs what the real chain charges (a burn that rises with every registration and
halves over time) and never prunes a validator permit holder: a flood is not free, and a newcomer is kept out only
while the attacker keeps paying."""
from __future__ import annotations

import pytest

from chain_helpers import hk, wallets
from dso.chain.base import ChainError
from dso.chain.local_burn import burn_price
from dso.chain.local_store import LocalChainParams
from dso.chain.wallets import dev_wallet
from sim.flood import run_flood

DEFAULTS = LocalChainParams()


def test_the_burn_halves_per_half_life_and_stays_within_its_bounds():
    """subtensor's rule on literal values: halved once per whole half-life passed (360 blocks), clamped."""
    assert burn_price(1.0, 0, 359, DEFAULTS) == (1.0, 0)
    assert burn_price(1.0, 0, 360, DEFAULTS) == (0.5, 360)
    assert burn_price(1.0, 100, 820, DEFAULTS) == (0.25, 820)       # two half-lives after block 100
    assert burn_price(1.0, 0, 360 * 40, DEFAULTS) == (0.0005, 360 * 40)  # never below burn_min
    assert burn_price(500.0, 0, 10, DEFAULTS) == (100.0, 0)          # never above burn_max
    assert burn_price(1.0, 0, 10 ** 9, DEFAULTS)[0] == 0.0005        # no underflow after any number of halvings


def test_registration_burns_the_price_and_raises_it(make_chain, clock):
    chain = make_chain(burn_initial=1.0, burn_min=0.0005)  # the real chain's defaults (the fixture's are free)
    a, b, c = wallets("burn", 3)
    assert chain.registration_burn() == 1.0
    chain.fund(hk(a), 3.0)
    assert chain.register(a) == 0 and chain.balance(hk(a)) == pytest.approx(2.0)
    assert chain.register(a) == 0 and chain.balance(hk(a)) == pytest.approx(2.0)  # already registered: free
    assert chain.registration_burn() == pytest.approx(1.26)
    chain.fund(hk(b), 1.26)
    assert chain.register(b) == 1 and chain.balance(hk(b)) == pytest.approx(0.0)
    assert chain.registration_burn() == pytest.approx(1.26 ** 2)
    clock.advance_blocks(360)
    assert chain.registration_burn() == pytest.approx(1.26 ** 2 / 2)
    with pytest.raises(ChainError) as e:  # c holds nothing: refused with what it would cost, nothing written
        chain.register(c)
    assert e.value.reason == "insufficient_balance" and "python -m dso.chain fund" in str(e.value)
    assert chain.uid_of(hk(c)) is None and chain.registration_burn() == pytest.approx(1.26 ** 2 / 2)
    with pytest.raises(ChainError) as e:
        chain.fund(hk(c), -1.0)
    assert e.value.reason == "bad_input"


def test_a_validator_with_a_permit_is_never_pruned(make_chain, clock):
    """The validator has no incentive (the local chain models no dividends) and is the oldest: before, it was the
    first to go.  Now the lowest-incentive neuron without a permit goes, and with none left the subnet is full."""
    chain = make_chain(max_uids=3, immunity_blocks=5, min_non_immune_uids=0)
    v, m1, m2 = wallets("permit", 3)
    for w in (v, m1, m2):
        chain.register(w)
    chain.add_stake(hk(v), 10.0)
    chain.set_weights(v, [1], [1.0])
    clock.advance_blocks(11)  # past immunity, after a consensus: m1 earns everything, v and m2 nothing
    assert chain.register(dev_wallet("//permit/new0")) == 2     # m2, not the validator
    clock.advance_blocks(6)
    assert chain.register(dev_wallet("//permit/new1")) == 2     # the newcomer (no incentive yet), not v
    clock.advance_blocks(1)
    chain.add_stake(hk(m1), 10.0)  # m1 gains a permit too: every neuron past immunity holds one
    with pytest.raises(ChainError) as e:
        chain.register(dev_wallet("//permit/new2"))
    assert e.value.reason == "subnet_full" and "permit" in str(e.value)
    assert chain.uid_of(hk(v)) == 0


def test_a_flood_is_not_free_and_keeps_newcomers_out_only_while_it_pays(tmp_path):
    """The same flood with free registration and with the burn (sim/flood.py): every block the attacker registers a
    fresh hotkey while its budget (500) pays; a newcomer holding 20 tries every 25 blocks.  Free, the attacker holds
    the subnet at no cost and newcomers get nowhere; with the burn, its budget buys a bounded number of sybils, the
    price rises to the cap and falls back, and newcomers get in at what it costs.  The validator and the earning
    honest miner are never pruned.  (Time is compressed: a 500-block immunity, 32 uids, 3000 blocks.)"""
    settings = {"blocks": 3000, "max_uids": 32, "immunity_blocks": 500, "newcomer_every": 25, "newcomer_budget": 20}
    (tmp_path / "free").mkdir()
    (tmp_path / "paid").mkdir()
    free = run_flood(burn=False, chain_dir=tmp_path / "free", **settings)
    paid = run_flood(burn=True, chain_dir=tmp_path / "paid", **settings)
    assert free.attacker_spent == 0 and free.sybils_registered > 3 * settings["max_uids"]
    assert free.newcomers_admitted <= free.newcomer_tries / 10 and free.refusals == {
        "subnet_full": free.newcomer_tries - free.newcomers_admitted}
    assert paid.attacker_spent <= paid.attacker_budget and paid.sybils_registered <= free.sybils_registered / 4
    assert paid.peak_burn == 100.0 and paid.final_burn < 50.0             # rose to the cap, fell back after
    assert paid.newcomers_admitted >= 2 * max(1, free.newcomers_admitted)
    for outcome in (free, paid):
        assert not outcome.validator_evicted and not outcome.honest_miner_evicted, outcome


def test_the_cli_funds_a_hotkey_and_status_shows_the_burn(make_chain, capsys, monkeypatch):
    from dso.chain.__main__ import main as cli_main
    monkeypatch.setenv("COLUMNS", "200")
    chain = make_chain(burn_initial=1.0, burn_min=0.0005)
    (wallet,) = wallets("cli-fund", 1)
    assert cli_main(["fund", "--path", str(chain.path), "--hotkey", hk(wallet), "--amount", "2.5"]) == 0
    assert "balance of 2.5 (a registration burns 1 now)" in capsys.readouterr().out
    assert chain.balance(hk(wallet)) == 2.5 and chain.register(wallet) == 0
    assert cli_main(["status", "--path", str(chain.path)]) == 0  # on the wall clock: many half-lives later
    assert "a registration burns 0.0005)" in " ".join(capsys.readouterr().out.split())  # wrapped at any width
    assert cli_main(["fund", "--path", str(chain.path), "--hotkey", hk(wallet), "--amount", "-9"]) == 1
    assert "cannot take 9" in capsys.readouterr().err
