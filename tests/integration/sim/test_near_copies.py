"""Near-copies and forged upload times: in the simulator, driving the validator's real window code,
none of the new attackers is paid and honest peers keep the weight."""
import pytest

from dso.config.sources import use_profile
from paper_training import use_paper_training
from sim.simulator import SimNet, behaviour_shares

ATTACKERS = ["noisycopy", "mixer", "scaledcopy", "replayer", "backdater", "hider"]
ROLES = ["honest"] * 4 + ["diligent"] + ATTACKERS
WINDOWS = 14


@pytest.fixture(scope="module")
def records(sim_dataset, tmp_path_factory, simnet_hparams):
    hp = simnet_hparams()
    hp.learning_rate = 5e-3
    # paper mode (one gradient, signed step), where the thresholds were measured.  Under inner steps (the default)
    # honest peers stay far from them (pair cosine ≤ 0.62, mix ≤ 0.66, previous aggregate ≤ 0.55 on this model),
    # but with every copy seen together with its source (the simulator's worst case: the validator's watch usually
    # sees the source a round earlier, docs/scoring.md) proof of computation kept a copy over its author in 10 of 14
    # windows and the noise-added copy earned 1.06 % of the cumulative weight (0 % final; with *mix* = 0.78,
    # which now catches the mixer in 14 of 14): still open
    use_paper_training(hp)
    ds = sim_dataset(hp)
    return SimNet(hp, ds, ROLES).run(WINDOWS)


def _cumulative(records):
    """Each role's part of all the weight posted over the run (windows that paid nobody post nothing)."""
    total: dict[str, float] = {}
    for r in records:
        for role, share in behaviour_shares(ROLES, r.weights).items():
            total[role] = total.get(role, 0.0) + share
    posted = sum(total.values())
    return {role: share / posted for role, share in total.items()}


def test_each_new_attacker_gets_at_most_one_percent_and_honest_peers_keep_95(records):
    final, cumulative = behaviour_shares(ROLES, records[-1].weights), _cumulative(records)
    for role in ATTACKERS:
        assert final[role] <= 0.01 and cumulative[role] <= 0.01, (role, final, cumulative)
    assert final["honest"] + final["diligent"] >= 0.95, final
    assert cumulative["honest"] + cumulative["diligent"] >= 0.95, cumulative


def test_disguised_copies_are_rejected_as_copies(records):
    uid = {role: ROLES.index(role) + 1 for role in ATTACKERS}
    # with 2-bit values the recompressed mix lands close to the threshold (cosine 0.865–0.95 against mix = 0.9; an
    # honest peer's own best mix reaches 0.84 in this mode), so how often it is caught depends on the trajectory:
    # 6 of 14 windows here.  It is never paid (the test above): in the windows it slips through, its proof of
    # computation shows no trace of its own data (its statistic stays around 0, scoring/pay.py)
    assert sum(r.rejections.get(uid["mixer"]) == "duplicate" for r in records) >= len(records) // 3
    assert all(r.rejections.get(uid["replayer"]) == "duplicate" for r in records[1:])  # nothing to replay at t=0
    assert all(r.rejections.get(uid["hider"]) == "too_late" for r in records)
    # noisycopy, scaledcopy and backdater copy uid 1: one group of four, seen together at the close, so in each
    # window proof of computation keeps one member's update and rejects the others
    group = [1, uid["noisycopy"], uid["scaledcopy"], uid["backdater"]]
    for r in records:
        assert sum(r.rejections.get(u) == "duplicate" for u in group) == 3, r.rejections


def test_a_forged_last_modified_cannot_get_the_author_rejected(records):
    author, backdater = 1, ROLES.index("backdater") + 1
    kept = sum(author not in r.rejections for r in records)
    caught = sum(r.rejections.get(backdater) == "duplicate" for r in records)
    # its LastModified claims 3 s before everyone's; the validator saw them together, so PoC decides, and the
    # author keeps its update in most windows (against three copies at once; trusting LastModified: in none)
    assert caught >= 0.7 * len(records) and kept >= 0.5 * len(records), (caught, kept)


@pytest.fixture(scope="module", params=[True, False], ids=["dct", "raw-domain"])
def steps_records(request, sim_dataset, tmp_path_factory):
    """The default training (inner steps, 2-bit values) on the local-network tests' model, in each codec domain.
    In the raw domain the first window's honest updates are alike (one Adam step from θ_0: near sign vectors whose top-k
    keeps the shared largest gradients; honest best mixes 0.69–0.78), which the window-relative bar of
    scoring.copies.mix_bar is for."""
    from dso.config.schema import HParams, ModelConfig

    hp = HParams(tokenizer="bytes",
                 model=ModelConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=2, ffn_hidden=128, seq_len=32))
    hp.batch_size, hp.assigned_sequences, hp.micro_batch, hp.chunk, hp.topk = 8, 8, 8, 32, 16
    hp.eval_sequences, hp.eval_peers, hp.learning_rate, hp.warmup_windows = 8, 3, 5e-3, 0
    hp.inner.steps_max, hp.inner.warmup_steps = 1, 0
    if request.param:
        use_profile(hp, "dct")  # the DCT with its own measured settings
    ds = sim_dataset(hp)
    return SimNet(hp, ds, STEPS_ROLES).run(STEPS_WINDOWS)


STEPS_ROLES = ["honest"] * 6 + ["mixer"]
STEPS_WINDOWS = 10


def test_under_inner_steps_the_mixer_is_caught_and_no_honest_peer_is(steps_records):
    """With *mix* = 0.9 this mixer (recompressed cosine 0.867–0.939 with the DCT) went uncaught in most windows;
    honest peers' own best mixes stay below 0.65 with the DCT, and below 0.28 in the raw domain after its first
    window, where they reach 0.69–0.78 (docs/scoring.md, "The help gate's rule", item 7)."""
    mixer = STEPS_ROLES.index("mixer") + 1
    caught = sum(r.rejections.get(mixer) == "duplicate" for r in steps_records)
    assert caught >= STEPS_WINDOWS - 1, [r.rejections for r in steps_records]
    honest_flagged = [(r.window, u) for r in steps_records for u, why in r.rejections.items()
                      if u != mixer and why == "duplicate"]
    assert not honest_flagged
