"""The simulator and the validator process run one window engine: for the same inputs, the same weights.

A real :class:`neurons.validator.Validator` (built by the production wiring against the embedded S3 server
and a LocalChain, publishing for real) is given, window after window, exactly the uploads the in-process
simulator's peers made — in place of its gather — and the simulator's chain randomness.  Its per-window
record must equal the simulator's: weights, scores, μ, ratings, the aggregated set and the model hash.
"""
from __future__ import annotations

import pytest

from dso.chain.local import LocalChain
from dso.chain.local_burn import FREE_REGISTRATION
from dso.chain.wallets import create_local_wallet, hotkey_address
from dso.data.dataset import Dataset
from dso.nn.model import model_hash
from embedded_nodes import node_config
from embedded_nodes import tiny_node_hparams as tiny
from neurons import validator_state
from neurons.context import build_context
from neurons.engine import genesis_lists
from neurons.validator import Validator
from sim.simulator import SimNet
from storage.gather import GatherResult
from storage.server import EmbeddedS3

ROLES = ["honest", "honest", "diligent", "freerider", "noise", "copier", "late", "malformed"]
WINDOWS = 6



@pytest.fixture(scope="module")
def validator_and_sim(tmp_path_factory, stdlib_corpus):
    root = tmp_path_factory.mktemp("identity")
    hp = tiny()
    cache = str(root / "cache")
    hp.data_hash = Dataset.for_run(hp, str(stdlib_corpus), cache).data_hash
    sim = SimNet(hp, Dataset.for_run(hp, str(stdlib_corpus), cache), ROLES)
    with EmbeddedS3.start() as s3:
        chain = LocalChain.create(root / "chain.sqlite", block_time=1.0, tempo=10, commit_interval_blocks=0,
                                  immunity_blocks=10_000, **FREE_REGISTRATION)
        wallets = str(root / "wallets")
        validator_wallet = create_local_wallet("validator", "default", wallets)
        assert chain.register(validator_wallet) == 0
        chain.add_stake(hotkey_address(validator_wallet), 1000.0)
        for peer in sim.peers:  # the simulator's uids are the chain's
            assert chain.register(create_local_wallet(f"miner{peer.uid}", "default", wallets)) == peer.uid
        cfg = node_config(root, s3, "validator", wallets, str(stdlib_corpus), cache, hp)
        validator = Validator(build_context(cfg, "validator", handle_signals=False))
        # the same starting point: window 0, the simulator's private seed, its chain randomness (both)
        validator.ctx.run = "0123456789abcdef"
        validator.book = validator_state.Bookkeeping(0, genesis_lists(0, [p.uid for p in sim.peers], hp.topg),
                                                     run=validator.ctx.run)
        validator.scores.secret = sim.state.secret
        validator.ctx.clock.window_randomness = sim.randomness  # type: ignore[method-assign]
        validator.ctx.clock.eval_randomness = lambda t, *_a, **_k: sim.eval_seed(t)  # type: ignore[method-assign]
        pairs = []
        for t in range(WINDOWS):
            payloads, rejections = sim.uploads(t)
            validator.gather = lambda _t, _peers, p=payloads, r=rejections: GatherResult(dict(p), dict(r))  # type: ignore
            line = validator.process(t)
            record = sim.conclude(t, payloads, rejections)
            pairs.append((line, record, model_hash(sim.model)))
        assert validator.writer.wait(30)  # weights are posted off the window loop
        posted = chain.weights().get(0)
        yield pairs, posted


def test_same_uploads_give_the_same_weights_and_model(validator_and_sim):
    pairs, _ = validator_and_sim
    for line, record, sim_hash in pairs:
        window = line["window"]
        assert line["model_hash"] == sim_hash, window
        assert line["aggregated"] == record.aggregated, window
        assert line["evaluated"] == sorted(record.loss_scores), window
        for key, mine in (("weights", record.weights), ("scores", record.scores), ("mu", record.mu),
                          ("loss_ratings", record.ratings), ("loss_scores", record.loss_scores)):
            assert line[key] == {str(u): v for u, v in mine.items()}, (window, key)
        assert line["rejections"] == {str(u): r for u, r in record.rejections.items()}, window


def test_the_comparison_is_not_vacuous(validator_and_sim):
    pairs, posted = validator_and_sim
    assert any(sum(line["weights"].values()) > 0.99 for line, _, _ in pairs), "nobody was ever paid"
    assert len({h for _, _, h in pairs}) == WINDOWS, "the model did not move every window"
    assert any(line["rejections"] for line, _, _ in pairs)
    # an all-zero row is not posted: the chain holds the last row that paid anyone
    last = next(line["weights"] for line, _, _ in reversed(pairs) if sum(line["weights"].values()) > 0.99)
    assert posted and posted == pytest.approx({int(u): w for u, w in last.items() if w > 0})
