import pytest
import torch

from dso.codec.demo import DeMoCodec
from dso.config.schema import HParams
from dso.protocol.payload import PayloadMeta
from dso.protocol.rejections import Reason, Rejection
from sim import behaviours
from storage.wire import Expect, decode_payload, encode_payload


def _codec():
    return DeMoCodec({"a": (64, 64), "b": (64,)}, chunk=32, topk=16, value_bits=4)


def _update(codec, seed):
    g = torch.Generator().manual_seed(seed)
    return codec.compress({n: torch.randn(s, generator=g) for n, s in codec.shapes.items()}, 0)


def _dense(codec, u):
    return torch.cat([t.reshape(-1) for t in codec.decompress(u).values()])


def plan(name: str, window: int) -> behaviours.Plan:
    return behaviours.make(name).plan(window)


def upload(name: str, codec, own, others=(), previous=None, window: int = 0, behaviour=None):
    acts = behaviour or behaviours.make(name)
    return acts.upload(behaviours.Inputs(codec, window, own, torch.Generator().manual_seed(0), list(others), previous))


def test_every_behaviour_is_one_class_with_a_name():
    assert len(behaviours.BEHAVIOURS) == len(set(behaviours.BEHAVIOURS)) == len(behaviours.REGISTRY)
    assert set(behaviours.GOOD) == {"honest", "diligent"} and set(behaviours.FORGERS) == {"backdater", "hider"}
    for name in behaviours.BEHAVIOURS:
        assert behaviours.make(name).name == name
    with pytest.raises(ValueError, match="unknown behaviour 'saint'; choose from honest, diligent"):
        behaviours.make("saint")


def test_plans():
    honest = plan("honest", 0)
    assert plan("diligent", 0).data_batches > honest.data_batches   # more of its data than honest
    assert honest.upload and not plan("absent", 0).upload
    assert plan("copier", 0).reads_peers and not plan("copier", 0).train
    assert plan("mixall", 0).reads_peers and not plan("mixall", 0).train
    assert plan("late", 0).late
    desync = [plan("desync", t).apply_aggregate for t in range(16)]
    assert desync.count(False) == 2 * behaviours.DESYNC_LENGTH
    assert plan("honest", 3).self_aggregate and not plan("noise", 3).self_aggregate
    for name, every in (("parttime2", 2), ("parttime3", 3), ("parttime5", 5), ("parttime2z", 2)):
        assert [plan(name, t).train for t in range(10)] == [t % every == 0 for t in range(10)], name


def test_transforms_do_what_they_say():
    codec = _codec()
    own = _update(codec, 1)
    others = [_update(codec, s) for s in range(2, 6)]
    assert _dense(codec, upload("freerider", codec, own)).abs().max() == 0
    flipped = _dense(codec, upload("signflip", codec, own))
    assert torch.nn.functional.cosine_similarity(flipped, _dense(codec, own), dim=0) < -0.99
    scaled = _dense(codec, upload("scaler", codec, own))
    assert torch.allclose(scaled, 1000 * _dense(codec, own), rtol=0.2, atol=1e-3)
    assert upload("copier", codec, own, others) is others[0]
    mean = torch.stack([_dense(codec, u) for u in others]).mean(0)
    ipm = _dense(codec, upload("ipm", codec, own, others))
    assert torch.nn.functional.cosine_similarity(ipm, mean, dim=0) < -0.5   # top-k of −ε·mean
    alie = _dense(codec, upload("alie", codec, own, others))
    assert torch.nn.functional.cosine_similarity(alie, mean, dim=0) > 0.2   # close to the mean: hard to spot
    assert upload("absent", codec, own) is None


def test_mixes_are_the_mean_of_what_they_read():
    codec = _codec()
    others = [_update(codec, s) for s in range(2, 6)]
    normalised = torch.stack([_dense(codec, u) / _dense(codec, u).norm() for u in others])

    def cosine(a, b):
        return float(torch.nn.functional.cosine_similarity(a, b, dim=0))

    for name in ("mixall", "noisymix", "scaledmix"):   # closer to the mean of all than to any one of them
        mixed = _dense(codec, upload(name, codec, None, others))
        assert cosine(mixed, normalised.mean(0)) > max(cosine(mixed, row) for row in normalised) + 0.1, name
    two = _dense(codec, upload("mixer", codec, None, others))
    assert cosine(two, normalised[:2].mean(0)) > max(cosine(two, row) for row in normalised) + 0.1
    assert upload("mixall", codec, None, others[:1]) is None                # nothing to mix
    half = _dense(codec, upload("scaledmix", codec, None, others)).norm()
    whole = _dense(codec, upload("mixall", codec, None, others)).norm()
    assert float(half / whole) == pytest.approx(behaviours.MIX_SCALE, rel=0.2)


def test_replays_send_an_earlier_update_again():
    codec = _codec()
    updates = [_update(codec, s) for s in range(10, 20)]
    selfreplay = behaviours.make("selfreplay")
    assert selfreplay.plan(0).train
    assert upload("", codec, updates[0], behaviour=selfreplay) is updates[0]
    assert not selfreplay.plan(1).train                                        # trains once
    assert all(upload("", codec, None, window=t, behaviour=selfreplay) is updates[0] for t in range(1, 5))
    stale = behaviours.make("stalecopy")
    sent = [upload("", codec, None, [updates[t]], window=t, behaviour=stale) for t in range(8)]
    lag = behaviours.REPLAY_LAG
    assert sent[:lag] == [None] * lag and all(sent[t] is updates[t - lag] for t in range(lag, 8))
    old = behaviours.make("oldreplayer")
    aggregates = [{n: torch.full(s, float(t + 1)) for n, s in codec.shapes.items()} for t in range(8)]
    sent = [upload("", codec, None, previous=aggregates[t], window=t, behaviour=old) for t in range(8)]
    assert sent[:lag - 1] == [None] * (lag - 1)
    assert _dense(codec, sent[lag]).max() == pytest.approx(2.0)               # the aggregate lag windows back
    part = behaviours.make("parttime3")
    sent = [upload("", codec, updates[t] if t % 3 == 0 else None, window=t, behaviour=part) for t in range(7)]
    assert [u is updates[3 * (t // 3)] for t, u in enumerate(sent)] == [True] * 7
    zeros = behaviours.make("parttime2z")
    assert _dense(codec, upload("", codec, None, window=1, behaviour=zeros)).abs().max() == 0


def test_wrong_data_behaviours_train_on_other_sequences(stdlib_corpus, tmp_path):
    from dso.data.dataset import Dataset
    ds = Dataset.from_config(str(stdlib_corpus), str(tmp_path), seq_len=32, seed=7, val_fraction=0.05)
    assigned = ds.assigned(3, 5, 64)
    rows = {tuple(r) for r in assigned.tolist()}
    for name in ("wrongdata", "fixedbatch", "othertext"):
        data = behaviours.make(name).training_data(ds, 3, 5, 64)
        assert data.shape == assigned.shape, name
        assert len(rows & {tuple(r) for r in data.tolist()}) <= 2, name      # none of its assignment
    fixed = behaviours.make("fixedbatch").training_data(ds, 3, 5, 64)
    assert len({tuple(r) for r in fixed.tolist()}) == behaviours.FIXED_BATCH
    assert torch.equal(behaviours.make("honest").training_data(ds, 3, 5, 64), assigned)


def test_what_a_behaviour_declares():
    assert behaviours.make("honest").declared(144, 96) == 144
    assert behaviours.make("mixall").declared(0, 96) == 96        # trained nothing, claims an honest count
    assert behaviours.make("wrongdata").declared(144, 96) == 144


def test_malformed_payloads_are_all_rejected_with_a_format_reason():
    codec, hp = _codec(), HParams()
    meta = PayloadMeta(3, 7, hp.protocol_version, hp.digest())
    good = encode_payload(codec, _update(codec, 1), torch.zeros(hp.sync_samples), meta)
    expect = Expect.from_hparams(hp, 7, uid=3)
    assert not isinstance(decode_payload(good, codec, expect), Rejection)
    reasons = set()
    for window in range(4):
        bad = behaviours.malformed_bytes(good, window)
        result = decode_payload(bad, codec, expect)
        assert isinstance(result, Rejection), window
        reasons.add(result.reason.value)
    assert "non_finite" in reasons and len(reasons) >= 3
    assert all(Rejection(Reason(r)).category == "format" for r in reasons)


def test_sybils_share_one_update(tmp_path):
    assert behaviours.sybil_exchange(tmp_path, 5, 1, None, 0.1) is None   # alone: it leads, with nothing to share
    assert (tmp_path / "member-5").exists()
    leader = behaviours.sybil_exchange(tmp_path, 4, 1, b"payload", 0.1)   # a lower uid joins: it trains
    assert leader == b"payload"
    assert behaviours.sybil_exchange(tmp_path, 5, 1, b"own", 0.5) == b"payload"
    assert behaviours.sybil_exchange(tmp_path, 5, 2, None, 0.1) is None              # nothing shared in time
