import torch

from dso.codec import DeMoCodec
from dso.config import HParams
from sim import behaviours
from storage.wire import Expect, PayloadMeta, decode_payload, encode_payload
from dso.rejections import Reason, Rejection


def _codec():
    return DeMoCodec({"a": (64, 64), "b": (64,)}, chunk=32, topk=16, value_bits=4)


def _update(codec, seed):
    g = torch.Generator().manual_seed(seed)
    return codec.compress({n: torch.randn(s, generator=g) for n, s in codec.shapes.items()}, 0)


def _dense(codec, u):
    return torch.cat([t.reshape(-1) for t in codec.decompress(u).values()])


def test_plans():
    honest = behaviours.plan("honest", 0)
    assert behaviours.plan("diligent", 0).data_batches > honest.data_batches   # more of its data than honest
    assert honest.upload and not behaviours.plan("absent", 0).upload
    assert behaviours.plan("copier", 0).reads_peers and not behaviours.plan("copier", 0).train
    assert behaviours.plan("late", 0).late
    desync = [behaviours.plan("desync", t).apply_aggregate for t in range(16)]
    assert desync.count(False) == 2 * behaviours.DESYNC_LENGTH
    assert behaviours.plan("honest", 3).self_aggregate and not behaviours.plan("noise", 3).self_aggregate


def test_transforms_do_what_they_say():
    codec, gen = _codec(), torch.Generator().manual_seed(0)
    own = _update(codec, 1)
    others = [_update(codec, s) for s in range(2, 6)]
    assert _dense(codec, behaviours.transform("freerider", codec, own, 0, gen)).abs().max() == 0
    flipped = _dense(codec, behaviours.transform("signflip", codec, own, 0, gen))
    assert torch.nn.functional.cosine_similarity(flipped, _dense(codec, own), dim=0) < -0.99
    scaled = _dense(codec, behaviours.transform("scaler", codec, own, 0, gen))
    assert torch.allclose(scaled, 1000 * _dense(codec, own), rtol=0.2, atol=1e-3)
    assert behaviours.transform("copier", codec, own, 0, gen, others) is others[0]
    mean = torch.stack([_dense(codec, u) for u in others]).mean(0)
    ipm = _dense(codec, behaviours.transform("ipm", codec, own, 0, gen, others))
    assert torch.nn.functional.cosine_similarity(ipm, mean, dim=0) < -0.5   # top-k of −ε·mean
    alie = _dense(codec, behaviours.transform("alie", codec, own, 0, gen, others))
    assert torch.nn.functional.cosine_similarity(alie, mean, dim=0) > 0.2   # close to the mean: hard to spot
    assert behaviours.transform("absent", codec, own, 0, gen) is None


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
