"""A peer that turns bad loses its weight within two evaluations, in the simulator on a tiny model."""
from __future__ import annotations

from sim import behaviours
from sim.simulator import SimNet

HONEST = 4
SWITCH = 8          # the best-paid honest peer uploads noise from this window on


def test_the_best_paid_peer_turning_to_noise_is_paid_nothing_from_its_second_bad_evaluation(sim_dataset, tmp_path):
    from dso.config.schema import HParams, ModelConfig

    hp = HParams(model=ModelConfig(d_model=32, n_layers=1, n_heads=2, ffn_hidden=64, seq_len=32), seed=1)
    hp.batch_size, hp.assigned_sequences, hp.micro_batch, hp.chunk, hp.topk = 8, 16, 8, 16, 8
    ds = sim_dataset(hp)
    # |S_t| = 6 ≥ 4: every peer is evaluated every window.  Its first noise window may still be paid (its records
    # hold its honest evaluations); from its second on its last two help ratios are noise's, ≈ 0 (docs/scoring.md)
    net = SimNet(hp, ds, ["honest"] * HONEST)
    turncoat: list[int] = []

    def turn(record) -> None:
        if record.window == SWITCH - 1:
            turncoat.append(max(record.weights, key=lambda uid: (record.weights[uid], -uid)))
            net.peers[turncoat[0] - 1].behaviour = behaviours.make("noise")
    records = net.run(SWITCH + 4, turn)
    uid = turncoat[0]
    assert records[SWITCH - 1].weights[uid] >= 0.25, records[SWITCH - 1].weights   # at least a fair share
    for record in records[SWITCH + 1:]:
        assert record.weights[uid] == 0.0, (record.window, record.weights)
