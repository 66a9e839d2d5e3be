"""The chain's state as of a past block, and the leader of a window decided from it (the leader hand-over).

Who leads window t is read from the state at t's last block.  Nodes ask at different moments (a validator
after the uploads close, a miner while it waits for the bundle), and a weight post between two of those
moments must not change the answer: otherwise two validators both believe they lead during a hand-over.
"""
from __future__ import annotations

import pytest

from chain_helpers import hk, wallets
from dso.chain.base import STATE_HISTORY_BLOCKS, ChainError
from dso.chain.cached import CachedChain
from dso.chain.roles import VALIDATOR, with_role
from dso.protocol.clock import Clock
from neurons.context import PeerDirectory

COMMIT = "dso1|http://127.0.0.1:9090|us-east-1|dso-v|KEY|secret"
IDLE = 20            # leader_idle_blocks in these tests
BLOCKS_PER_WINDOW = 10


def validators(chain, prefix: str, stakes: list[float]):
    ws = wallets(prefix, len(stakes))
    for w, stake in zip(ws, stakes, strict=True):
        chain.register(w)
        chain.add_stake(hk(w), stake)
        chain.commit(w, with_role(COMMIT, VALIDATOR))
    return ws


def directory(chain) -> PeerDirectory:
    return PeerDirectory(chain, readers=None, uid=99, own=None, leader_idle_blocks=IDLE,  # type: ignore[arg-type]
                         clock=Clock(chain, BLOCKS_PER_WINDOW, 3.0))


def test_metagraph_and_commitments_read_as_of_a_past_block(make_chain, clock):
    chain = make_chain()
    a, b = validators(chain, "past", [30.0, 20.0])  # registered, staked and committed at block 1000
    chain.set_weights(a, [1], [1.0])
    clock.advance_blocks(5)
    chain.add_stake(hk(b), 50.0)
    chain.commit(b, COMMIT)  # b drops its validator tag at block 1005
    chain.set_weights(b, [0], [1.0])
    clock.advance_blocks(5)
    then, now = chain.metagraph(1004), chain.metagraph()
    assert [n.stake for n in then] == [30.0, 20.0] and [n.stake for n in now] == [30.0, 70.0]
    assert [n.last_update for n in then] == [1000, 0] and [n.last_update for n in now] == [1000, 1005]
    assert chain.commitments(1004)[1].endswith("|validator") and chain.commitments()[1] == COMMIT
    assert [n.uid for n in chain.protocol_validators(1004)] == [0, 1]
    assert [n.uid for n in chain.protocol_validators()] == [0]


def test_state_reads_refuse_future_and_pruned_blocks(make_chain, clock):
    chain = make_chain()
    with pytest.raises(ChainError) as e:
        chain.metagraph(chain.block() + 1)
    assert e.value.reason == "future_block"
    clock.advance_blocks(STATE_HISTORY_BLOCKS + 1)
    with pytest.raises(ChainError) as e:
        chain.commitments(chain.block() - STATE_HISTORY_BLOCKS - 1)
    assert e.value.reason == "pruned" and "keeps 256 blocks" in str(e.value)
    chain.metagraph(chain.block() - STATE_HISTORY_BLOCKS)  # the oldest kept block still reads


def test_pruning_keeps_the_history_the_chain_promises(make_chain, clock):
    """Consensus runs prune old weight rows; a post inside the history must still be the last update then."""
    chain = make_chain()
    (v,), (m,) = validators(chain, "prune", [10.0]), wallets("prune-m", 1)
    chain.register(m)
    chain.set_weights(v, [1], [1.0])          # block 1000
    clock.advance_blocks(40)
    chain.set_weights(v, [1], [2.0])          # block 1040
    clock.advance_blocks(255)                 # block 1295: 1039 is the oldest block still kept
    chain.metagraph()                         # runs the consensus epochs (and prunes)
    assert chain.metagraph(1039)[0].last_update == 1000
    assert chain.metagraph(1040)[0].last_update == 1040


def test_a_post_after_the_decision_block_does_not_change_who_leads_that_window(make_chain, clock):
    """The hand-over race: A (more stake) stopped posting; B posts.  Window 101 (blocks 1010-1019) is decided
    at block 1019, where A's last post is 19 blocks old: A leads it, whoever asks and whenever.  A late post by
    A (it was only slow) changes the leader of the windows after it, never of a window already decided."""
    chain = make_chain()
    a, b = validators(chain, "race", [30.0, 20.0])
    chain.set_weights(a, [1], [1.0])          # block 1000 (window 100)
    clock.advance_blocks(20)                  # block 1020: window 101 has ended
    chain.set_weights(b, [0], [1.0])          # block 1020
    peers = directory(chain)
    assert peers.decision_block(101) == 1019 and peers.leader_uid(101) == 0
    clock.advance_blocks(2)                   # block 1022
    assert peers.leader_uid(None) == 1        # at block 1021 A is 21 blocks idle: B leads from now on
    assert peers.leader_uid(101) == 0         # asked later, window 101 is still A's
    clock.advance_blocks(8)                   # block 1030: window 102 has ended
    assert peers.leader_uid(102) == 1
    chain.set_weights(a, [1], [1.0])          # A comes back at block 1030
    clock.advance_blocks(5)
    assert peers.leader_uid(102) == 1 and peers.leader_uid(101) == 0  # the past is what it was
    assert peers.leader_uid(103) == 0         # window 103 is not over: decided as of block 1034, A is back
    assert chain.leading_protocol_validator(IDLE).uid == 0


def test_a_window_not_yet_over_is_decided_by_the_latest_settled_block(make_chain, clock):
    chain = make_chain()
    validators(chain, "open", [10.0])
    peers = directory(chain)
    assert peers.decision_block(100) == chain.block() - 1 == 999
    assert peers.decision_block(10) == chain.block() - STATE_HISTORY_BLOCKS  # older than the history: its start


def test_the_cached_chain_keeps_settled_state_for_good(make_chain, clock, monkeypatch):
    inner = make_chain()
    validators(inner, "cache", [10.0])
    reads = []
    real = inner.metagraph
    monkeypatch.setattr(inner, "metagraph", lambda block=None: reads.append(block) or real(block))
    cached = CachedChain(inner)
    clock.advance_blocks(3)
    first = cached.metagraph(1001)
    cached.begin_window("next")             # per-window reads are dropped, settled blocks are not
    assert cached.metagraph(1001) == first and reads == [1001]
    now = inner.block()
    cached.metagraph(now)                    # the current block can still change: read every time
    cached.metagraph(now)
    assert reads == [1001, now, now]
