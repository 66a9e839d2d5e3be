"""A validator on two ranks (neurons/validator_ranks.py) scores exactly as one process.

The scripted miners of mininet.py (honest, anti, noise, zeros, stale) for three windows: rank 0 scores them
with score_window, its evaluated peers shared with rank 1 (which follows its orders, neurons/ranks.py);
one process scores the same windows alone.  Every figure of every window's report — LossScores, μ,
ratings, scores, weights, the next top-G — is the same, bit for bit (CPU, one thread per rank).
"""
from __future__ import annotations

import numpy as np
import pytest
from mininet import MiniNet, chain_randomness, eval_seed

from dso.data import Dataset
from scoring import ValidatorState, score_window
from sim.ranks import run_ranks

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
SECRET = "7a" * 16
BEHAVIOURS = {1: "honest", 2: "honest", 3: "anti", 4: "noise", 5: "zeros", 6: "stale", 7: "honest"}
WINDOWS = 3


def _dataset(corpus) -> Dataset:
    ids = np.frombuffer(corpus.read_bytes(), dtype=np.uint8).copy()
    return Dataset(ids, "stdlib-topics", seq_len=16, seed=7, val_fraction=0.02)


def _windows(hp, dataset, evaluator=None) -> list[dict]:
    net = MiniNet(hp, dataset, BEHAVIOURS)
    state = ValidatorState.new(secret=SECRET)
    reports = []
    for window in range(WINDOWS):
        payloads = net.payloads(window)
        report = score_window(state, net.model, net.codec, dataset, hp, window, payloads, {}, sorted(BEHAVIOURS),
                              chain_randomness(window), eval_seed(window), evaluator=evaluator(net) if evaluator
                              else None)
        net.apply_aggregate(window, state.top_g, payloads)
        reports.append(report.to_dict())
    return reports


def _ranked(hp, corpus) -> object:
    from dso.config import Config
    from dso.distributed import join_group
    from neurons.ranks import Orders, follow_leader
    from neurons.validator_ranks import RankedEvaluator, follower_parts

    ranks = join_group("cpu")
    if not ranks.leader:
        return follow_leader(Config(), ranks, follower_parts)
    orders = Orders(ranks)
    orders.hello(hp)
    reports = _windows(hp, _dataset(corpus), lambda net: RankedEvaluator(ranks, orders, net.codec, hp, net.model))
    orders.stop()
    return reports


def test_two_ranks_give_one_process_scores_and_weights(hp, dataset, stdlib_corpus):
    alone = _windows(hp, dataset)
    ranked, orders = run_ranks(_ranked, 2, hp, stdlib_corpus, timeout=300)
    assert orders == WINDOWS  # rank 1 evaluated its share in every window
    assert all(len(r["evaluated"]) == hp.eval_peers for r in alone)
    assert any(r["loss_scores"] for r in alone) and any(w > 0 for r in alone for w in r["weights"].values())
    assert ranked == alone
