"""A validator on two ranks (neurons/validator_ranks.py) scores exactly as one process.

The scripted miners of mininet.py (honest, anti, noise, zeros, stale) for three windows: rank 0 scores them
with score_window, its evaluated peers shared with rank 1 (which follows its orders, neurons/ranks.py);
one process scores the same windows alone.  Every figure of every window's report — LossScores, μ,
proof-of-computation statistics, ratings, scores, weights, the next top-G — is
the same, bit for bit (CPU, one thread per rank).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from dso.data.dataset import Dataset
from dso.training.train import learning_rate
from mininet import MiniNet, chain_randomness, eval_seed
from scoring import ValidatorState, score_window
from scoring.window import Scorer, WindowEvidence
from sim.ranks import run_ranks

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
SECRET = "7a" * 16
BEHAVIOURS = {1: "honest", 2: "honest", 3: "anti", 4: "noise", 5: "zeros", 6: "stale", 7: "honest"}
WINDOWS = 3


def _dataset(corpus) -> Dataset:
    ids = np.frombuffer(corpus.read_bytes(), dtype=np.uint8).copy()
    return Dataset(ids, "stdlib-topics", seq_len=16, seed=7, val_fraction=0.02)


def _control(net, hp, window, payloads):
    """A consensus step from window 1 on (the signed sum of the honest updates; none in window 0): both ways of the
    random side travel to the other rank."""
    if window == 0:
        return None
    total = {n: torch.zeros(s) for n, s in net.shapes.items()}
    for uid in (u for u, b in BEHAVIOURS.items() if b == "honest"):
        for n, d in net.codec.decompress(payloads[uid].update).items():
            total[n] += d
    return {n: hp.eval_scale * learning_rate(hp, window) * torch.sign(t) for n, t in total.items()}


def _windows(hp, dataset, evaluator=None) -> list[dict]:
    net = MiniNet(hp, dataset, BEHAVIOURS)
    state = ValidatorState.new(secret=SECRET)
    reports = []
    for window in range(WINDOWS):
        payloads = net.payloads(window)
        # uid 7 declares one trained sequence: no sample to test (an empty batch, which never travels)
        payloads[7].meta = dataclasses.replace(payloads[7].meta, trained=1)
        evidence = WindowEvidence(window, payloads, {}, sorted(BEHAVIOURS), chain_randomness(window),
                                  eval_seed(window), control=_control(net, hp, window, payloads))
        scorer = Scorer(net.model, net.codec, dataset, hp, evaluator(net) if evaluator else None)
        reports.append(score_window(state, scorer, evidence).to_dict())
        net.apply_aggregate(window, state.top_g, payloads)
    return reports


def _ranked(hp, corpus) -> object:
    from dso.config.schema import Config
    from dso.distributed.ranks import join_group
    from neurons.ranks import Orders, follow_orders, receive
    from neurons.validator_ranks import RankedEvaluator, follower_parts

    ranks = join_group("cpu")
    if not ranks.leader:
        # the parts from the test's own hyper-parameters: their lenient proof-of-computation threshold (conftest)
        # is one no configuration accepts, so the leader's hello is received but not decoded
        assert receive(ranks)[1] == "hello"
        return follow_orders(ranks, follower_parts(Config(), ranks, hp))
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
    assert any(r["poc_statistics"] for r in alone)
    assert ranked == alone
