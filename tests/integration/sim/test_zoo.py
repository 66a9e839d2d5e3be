"""Only work is paid: the simulator's zoo of ways to be paid without it, on a tiny model and the default data.

One seed runs every such behaviour beside honest peers and checks each is caught by what is meant to catch it;
ten seeds of a smaller zoo check the shares — the claims the ``incentives`` benchmark measures at full size
(scripts/benchmarks/incentives.py, docs/scoring.md "Pay")."""
from __future__ import annotations

import statistics

import pytest

from dso.config.schema import HParams, ModelConfig
from scoring.formulas import poc_verdict
from sim import behaviours
from sim.simulator import SimNet, behaviour_shares

WRONG_DATA = ["wrongdata", "fixedbatch", "othertext"]
REPLAYS = ["selfreplay", "stalecopy", "replayer", "oldreplayer"]
MIXES = ["mixer", "mixall", "noisymix", "scaledmix"]
PART_TIME = ["parttime2", "parttime3", "parttime5", "parttime2z"]
ZOO = ["honest"] * 3 + ["diligent"] + WRONG_DATA + REPLAYS + MIXES + PART_TIME


def tiny(seed: int, eval_peers: int) -> HParams:
    hp = HParams(model=ModelConfig(vocab_size=1024, d_model=32, n_layers=1, n_heads=2, ffn_hidden=64, seq_len=32),
                 seed=seed)
    hp.batch_size, hp.assigned_sequences, hp.micro_batch, hp.chunk, hp.topk = 8, 32, 8, 16, 8
    hp.eval_peers, hp.fast_peers = eval_peers, 32
    return hp


def posted_share(records, roles: list[str], names) -> float:
    """The part of everything posted over the run that went to the behaviours ``names``."""
    total = sum(sum(r.weights.values()) for r in records)
    return sum(share for r in records for role, share in behaviour_shares(roles, r.weights).items()
               if role in names) / total


@pytest.fixture(scope="module")
def zoo(sim_dataset):
    hp = tiny(seed=5, eval_peers=10)
    return SimNet(hp, sim_dataset(hp), ZOO).run(10), hp


def uids(role: str) -> list[int]:
    return [i + 1 for i, r in enumerate(ZOO) if r == role]


def test_every_zero_compute_behaviour_and_wrong_data_earn_nothing(zoo):
    records, _ = zoo
    for name in WRONG_DATA + REPLAYS + MIXES + PART_TIME:
        assert posted_share(records, ZOO, (name,)) == 0.0, name
    assert posted_share(records, ZOO, ("honest", "diligent")) == pytest.approx(1.0)
    assert all(sum(r.weights.values()) == pytest.approx(1.0) for r in records[4:])   # everyone proven by then


def test_replays_and_empty_updates_are_rejected_in_every_window_they_are_sent(zoo):
    records, _ = zoo
    for name in ("selfreplay", "oldreplayer", "stalecopy"):
        sent_again = [r for r in records[behaviours.REPLAY_LAG + 1:]]
        assert all(r.rejections.get(uids(name)[0]) == "replay" for r in sent_again), name
    for name, every in (("parttime2", 2), ("parttime3", 3), ("parttime5", 5)):
        off = [r for r in records[1:] if r.window % every]
        assert all(r.rejections.get(uids(name)[0]) == "replay" for r in off), name
    assert all(r.rejections.get(uids("parttime2z")[0]) == "empty" for r in records if r.window % 2)
    # the previous aggregate again: the near-copy test's business (a copy of this window's other input)
    assert all(r.rejections.get(uids("replayer")[0]) == "duplicate" for r in records[1:])


def test_the_proof_of_computation_tells_trained_sequences_from_the_rest(zoo):
    records, hp = zoo
    statistics_of = {name: [z for r in records for u, z in r.poc_statistics.items() if u in uids(name)]
                     for name in ("honest", "diligent", *WRONG_DATA, "mixall", "noisymix", "scaledmix")}
    honest = statistics_of["honest"] + statistics_of["diligent"]
    assert len(honest) >= 20 and sum(poc_verdict(z, hp.poc_threshold) for z in honest) >= 0.95 * len(honest)
    for name in (*WRONG_DATA, "mixall", "noisymix", "scaledmix"):
        evaluated = statistics_of[name]
        if evaluated:  # those not rejected as copies first
            assert statistics.fmean(evaluated) < hp.poc_threshold, (name, evaluated)


@pytest.mark.parametrize("seed", range(10))
def test_over_ten_seeds_work_is_paid_and_in_proportion(sim_dataset, seed):
    """A smaller zoo, one family member each, everyone evaluated every window: honest and diligent hold ≥ 99 % of
    what is posted, and the diligent peer's last share is 1.5–2.5 × the honest mean."""
    roles = ["honest"] * 3 + ["diligent", "wrongdata", "selfreplay", "mixall", "parttime2"]
    hp = tiny(seed=seed, eval_peers=len(roles))
    records = SimNet(hp, sim_dataset(hp), roles).run(8)
    assert posted_share(records, roles, ("honest", "diligent")) >= 0.99
    last = records[-1].weights
    honest = statistics.fmean(last[u] for u in (1, 2, 3))
    assert 1.5 <= last[4] / honest <= 2.5, last
