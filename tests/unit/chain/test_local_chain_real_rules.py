"""LocalChain models the real chain's rules: weight rate limit, minimum weights, max weight clip,
version key, stake from emission with top-K permits, last update, and protocol-validator tags."""
from __future__ import annotations

import pytest

from chain_helpers import hk, wallets
from dso.chain.base import ChainError, WeightRules
from dso.chain.roles import VALIDATOR, with_role

COMMIT = "dso1|http://127.0.0.1:9090|us-east-1|dso-v|KEY|secret"


def staked(chain, prefix: str, n: int, stake: float = 10.0):
    ws = wallets(prefix, n)
    for w in ws:
        chain.register(w)
    chain.add_stake(hk(ws[0]), stake)  # uid 0 validates
    return ws


def refused(reason: str, post) -> str:
    with pytest.raises(ChainError) as e:
        post()
    assert e.value.reason == reason, e.value
    return str(e.value)


def test_weight_rules_are_the_chain_parameters(make_chain):
    chain = make_chain(weights_rate_limit=100, min_allowed_weights=8, max_weight_limit=0.25, weights_version=3)
    assert chain.weight_rules() == WeightRules(100, 8, 0.25, 3, False, 0)
    assert make_chain().weight_rules() == WeightRules()  # defaults: no limit (docs/chain.md)


def test_rate_limit_refuses_until_the_interval_has_passed(make_chain, clock):
    chain = make_chain(weights_rate_limit=5)
    v, m = staked(chain, "rate", 2)
    chain.set_weights(v, [1], [1.0])
    assert chain.metagraph()[0].last_update == 1000
    clock.advance_blocks(4)
    assert "next allowed at block 1005" in refused("rate_limited", lambda: chain.set_weights(v, [1], [1.0]))
    clock.advance_blocks(1)
    chain.set_weights(v, [1], [2.0])  # exactly the limit: allowed, as on subtensor (since >= limit)
    assert chain.metagraph()[0].last_update == 1005


def test_too_few_positive_weights_are_refused(make_chain):
    chain = make_chain(min_allowed_weights=3)
    v, *miners = staked(chain, "few", 5)
    message = refused("too_few_weights", lambda: chain.set_weights(v, [1, 2, 3], [1.0, 1.0, 0.0]))
    assert "2 positive weights" in message and "at least 3" in message
    chain.set_weights(v, [1, 2, 3], [1.0, 1.0, 0.5])
    chain.set_weights(v, [0], [1.0])  # a lone self-weight is exempt, as on the real chain
    capped = make_chain(min_allowed_weights=100)  # the minimum is capped at the subnet size (3 uids)
    v2, *_ = staked(capped, "cap", 3)
    refused("too_few_weights", lambda: capped.set_weights(v2, [1], [1.0]))
    capped.set_weights(v2, [0, 1, 2], [1.0, 1.0, 1.0])


def test_rows_are_clipped_to_max_weight_limit(make_chain):
    chain = make_chain(max_weight_limit=0.5)
    v, *_ = staked(chain, "clip", 4)
    chain.set_weights(v, [1, 2, 3], [0.8, 0.1, 0.1])
    # cut at t = 0.5 * 0.2 / (1 - 0.5) = 0.2: [0.2, 0.1, 0.1] / 0.4
    assert chain.weights()[0] == pytest.approx({1: 0.5, 2: 0.25, 3: 0.25})


def test_an_outdated_version_key_is_refused(make_chain):
    chain = make_chain(weights_version=3)
    v, _ = staked(chain, "ver", 2)
    assert "below the subnet's weights version 3" in refused("outdated_version",
                                                               lambda: chain.set_weights(v, [1], [1.0], version_key=2))
    chain.set_weights(v, [1], [1.0], version_key=3)
    chain.weights_version = 4  # what open_chain sets from --subtensor.weights_version
    chain.set_weights(v, [1], [1.0])
    refused("bad_input", lambda: chain.set_weights(v, [1], [1.0], version_key=-1))


def test_a_successful_miner_earns_stake_and_takes_the_permit(make_chain, clock):
    """Emission is staked on the earner's hotkey each tempo; permits go to the top-K stakes."""
    chain = make_chain(emission_to_stake=1.0, max_validators=1, min_validator_stake=5.0)
    v, m = staked(chain, "earn", 2, stake=100.0)
    chain.set_weights(v, [1], [1.0])
    clock.advance_blocks(10)  # one tempo: 10 emission to the miner, staked
    miner = chain.metagraph()[1]
    assert miner.stake == pytest.approx(10.0) and miner.incentive == 1.0 and not miner.validator_permit
    clock.advance_blocks(100)  # 11 tempos in all: 110 > 100, the miner holds the only permit
    graph = chain.metagraph()
    assert graph[1].validator_permit and not graph[0].validator_permit
    assert graph[1].stake == pytest.approx(110.0)
    clock.advance_blocks(50)  # the validator lost its permit: no weights count, no more emission
    assert chain.metagraph()[1].stake == pytest.approx(110.0)


@pytest.mark.parametrize("read_every", [1, 7, 1000])
def test_staked_emission_is_the_same_however_often_the_chain_is_read(make_chain, clock, read_every):
    """Consensus runs are batched when their inputs cannot differ; reading after every tempo or once at
    the end must give the same stakes (three miners crossing the permit threshold at different times)."""
    chain = make_chain(emission_to_stake=1.0, max_validators=3, min_validator_stake=1.0)
    v, *miners = staked(chain, f"lazy{read_every}", 4, stake=1000.0)
    chain.set_weights(v, [1, 2, 3], [0.6, 0.3, 0.1])
    for tempo in range(1, 200):
        clock.advance_blocks(10)
        if tempo % read_every == 0:
            chain.metagraph()
    graph = chain.metagraph()
    # 199 tempos at 10 emission each, shared 0.6/0.3/0.1 while all three only earn; the validator keeps the
    # top permit, the miners take the other two as they pass each other (none of them posts weights)
    assert sum(n.stake for n in graph[1:]) == pytest.approx(1990.0)
    assert [round(n.stake, 6) for n in graph[1:]] == pytest.approx([1194.0, 597.0, 199.0])
    assert [n.validator_permit for n in graph] == [True, True, True, False]


def test_protocol_validators_carry_the_tag_and_the_leader_is_chosen_among_them(make_chain, clock):
    chain = make_chain()
    ours, third_party, miner = wallets("proto", 3)
    for w, stake in ((ours, 10.0), (third_party, 50.0), (miner, 0.0)):
        chain.register(w)
        if stake:
            chain.add_stake(hk(w), stake)
    chain.commit(ours, with_role(COMMIT, VALIDATOR))
    chain.commit(third_party, COMMIT)
    chain.commit(miner, COMMIT)
    assert chain.leading_validator().uid == 1  # by stake alone: a validator that does not run the protocol
    assert [n.uid for n in chain.protocol_validators()] == [0]
    assert chain.leading_protocol_validator().uid == 0
    assert chain.leading_protocol_validator(max_idle_blocks=20) is None  # has never posted weights
    chain.set_weights(ours, [2], [1.0])
    clock.advance_blocks(15)
    assert chain.leading_protocol_validator(max_idle_blocks=20).uid == 0
    clock.advance_blocks(10)
    assert chain.leading_protocol_validator(max_idle_blocks=20) is None  # stopped posting: hands over


def test_a_permit_lost_mid_batch_stops_the_emission_even_when_read_once(make_chain, clock):
    """The same story read only at the end: the batched runs must stop where the permit moved."""
    chain = make_chain(emission_to_stake=1.0, max_validators=1, min_validator_stake=5.0)
    v, m = staked(chain, "once", 2, stake=100.0)
    chain.set_weights(v, [1], [1.0])
    clock.advance_blocks(160)
    graph = chain.metagraph()
    assert graph[1].stake == pytest.approx(110.0) and graph[1].validator_permit and not graph[0].validator_permit
