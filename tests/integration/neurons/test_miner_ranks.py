"""One miner on two ranks (neurons/miner_ranks.py) against the same miner in one process (neurons/miner.py).

The stand-in context of test_miner_ahead.py (no chain, no S3; the leader's bundle arrives after three looks)
drives both: train window 1 while window 0's bundle is on its way, rebase onto θ_1, finish window 1 and
compress it.  The two-rank miner is rank 0 of a gloo group whose rank 1 follows its orders
(neurons/ranks.py); its θ lives only in the ranks' slices (the leader's model is structure only), and the
stand-in bundle is an outer step of that θ.  Checks: the same steps and losses, the same θ hash in the record
and in the payload's header, the same SyncScore samples, an update keeping the same indices, every rank's
state file written, and a restarted leader restoring its own.
The inner loop on its own: the pseudo-gradient within 1e-5 relative L2 of one process's, >= 99.9 % of the kept
indices the same, and the sharded compression one process's, bit for bit.
"""
from __future__ import annotations

import time

import numpy as np
import pytest
from unit.neurons.test_miner_ahead import Follower, make_miner  # the unit tier's stand-in miner

from sim.ranks import run_ranks
from sim.scale import as_arrays, index_agreement, relative_l2

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # gloo/FSDP warnings in the rank processes


def _window(miner) -> dict:
    applied, summary = miner.train_ahead(0, until=time.time() + 60)
    own, loss = miner.train(1)
    return {"applied": applied, "summary": summary, "steps": miner.report.steps, "ahead": miner.ahead_steps,
            "losses": miner.report.losses, "update": as_arrays(own), "theta": miner.theta_hash(),
            "dense": {n: t.numpy().copy() for n, t in miner.ctx.codec.decompress(own).items()},
            "sync": miner.sync_samples(1).numpy().copy(), "payload_hash": miner.meta(1).model_hash}


def _ranked(tmp, world: int) -> dict | None:
    from dso.distributed.ranks import join_group
    from neurons.context import structure_only
    from neurons.miner_ranks import RankedMiner, follower_parts
    from neurons.ranks import Orders, follow_leader

    ranks = join_group("cpu")
    single, delta = make_miner(tmp / "template", after=3)  # the same settings, θ and bundle for every rank
    cfg = single.ctx.cfg
    if not ranks.leader:
        cfg.neuron.state_dir = str(tmp / f"rank{ranks.rank}")
        return {"orders": follow_leader(cfg, ranks, follower_parts)}
    orders = Orders(ranks)
    orders.hello(single.ctx.hp)
    ctx = single.ctx
    ctx.model = structure_only(ctx.hp)  # as a torchrun miner's leader: θ only in the ranks' slices
    ctx.state_dir = tmp / "leader"
    ctx.state_dir.mkdir(parents=True)
    miner = RankedMiner(ctx, ranks, orders)
    miner.follower = Follower(miner.theta, delta, 3, ctx.hp)
    miner.model_window = 0
    out = _window(miner)
    miner.save_state()
    steps = miner.inner.step_count
    again = RankedMiner(ctx, ranks, orders)  # a restarted leader reads its own state file
    out.update(steps_saved=steps, steps_restored=again.inner.step_count,
               files=sorted(p.name for p in ctx.state_dir.iterdir()))
    orders.stop()
    return out


def test_a_two_rank_miner_trains_and_compresses_as_one_process(tmp_path):
    miner, _ = make_miner(tmp_path / "single", after=3)
    single = _window(miner)
    leader, follower = run_ranks(_ranked, 2, tmp_path / "ranked", 2, timeout=300)
    assert leader["applied"] and single["applied"]
    assert (leader["steps"], leader["ahead"]) == (single["steps"], single["ahead"]) == (5, 3)
    assert np.allclose(leader["losses"], single["losses"], rtol=1e-5, atol=0)
    assert leader["theta"] == single["theta"]  # θ_1 = θ_0 + the bundle's Δ, the same bits
    assert leader["payload_hash"] == single["payload_hash"] == single["theta"]  # the upload's model_hash
    assert leader["sync"].shape == single["sync"].shape and leader["sync"].size >= 2
    assert np.array_equal(leader["sync"], single["sync"])  # SyncScore samples of θ_1, read from the slices
    agreement = index_agreement({n: u["idx"] for n, u in leader["update"].items()},
                                {n: u["idx"] for n, u in single["update"].items()})
    assert agreement >= 0.999
    assert relative_l2(leader["dense"], single["dense"]) < 1e-3
    assert follower["orders"] > 10  # it took every step, scatter and compression with the leader
    assert leader["files"] == ["error_feedback.rank0-of-2.safetensors", "inner_state.rank0-of-2.safetensors"]
    assert (tmp_path / "ranked" / "rank1" / "default-default" / "miner" / "inner_state.rank1-of-2.safetensors").exists()
    assert leader["steps_restored"] == leader["steps_saved"] > 0


def test_two_ranks_give_one_process_pseudo_gradient_and_kept_indices(tiny_hparams):
    """The inner loop alone (sim/scale.py, bench.py's scale.fsdp_*): 3 AdamW steps from the same θ_0 on the same
    batches, on one process and on 2 gloo ranks each training its contiguous half of every batch."""
    from sim.scale import compare

    hp = tiny_hparams
    hp.inner.steps_max, hp.micro_batch = 3, hp.batch_size // 2  # a rank's half of a batch is one micro-batch
    got = compare(hp, steps=3)
    assert got["sharded_tensors"] > 0 and got["gathered_tensors"] < got["tensors"]  # compressed on the slices
    assert np.allclose(got["losses_ranks"], got["losses_single"], rtol=1e-5, atol=0)
    assert got["rel_err"] <= 1e-5, got["rel_err"]
    assert got["index_agreement"] >= 0.999, got["index_agreement"]
    assert got["compression_exact"]  # the ranks' own pseudo-gradient compresses as one process compresses it
