"""Commit-reveal objects in S3 (storage/reveal.py) on the embedded server: every verdict a reader can reach,
the timing rules of both windows, and the aggregation set every node computes identically."""
from __future__ import annotations

import math

import pytest
import torch

from dso.codec.demo import DeMoCodec
from dso.config.schema import HParams, ModelConfig
from dso.nn.model import build_model, parameter_shapes
from dso.protocol.clock import PutWindow, certain_after, commit_look_ends, reveal_time, reveal_window_after
from dso.protocol.commit import commitment_hash
from dso.protocol.payload import Payload, PayloadMeta
from dso.protocol.rejections import Reason
from neurons.reveal import settings_problem
from storage import keys
from storage.gather import GatherOptions, ReaderCache
from storage.jsonobj import encode_json
from storage.reveal import (
    CommitReveal,
    commit_object,
    fetch_revealed,
    gather_window,
    parse_commit,
    parse_reveal,
    put_commit,
    put_reveal,
    reveal_object,
    seal,
)
from storage.wire import Expect, encode_payload

torch.set_num_threads(1)
W = 9  # the window every test uses
RUN = "c0ffee00c0ffee00"  # keys of the commitments-look test, apart from the other tests' objects
NO_HURRY = {"budget": 10.0, "peer_seconds": 10.0}  # these looks face no hung server: let a slow HEAD answer


@pytest.fixture(scope="module")
def hp():
    hp = HParams(model=ModelConfig(d_model=32, n_layers=1, n_heads=2, ffn_hidden=64, seq_len=16))
    hp.chunk, hp.topk, hp.sync_samples, hp.commit_reveal = 16, 8, 16, True
    return hp


@pytest.fixture(scope="module")
def codec(hp):
    return DeMoCodec.from_hparams(parameter_shapes(build_model(hp.model, hp.seed)), hp)


@pytest.fixture(scope="module")
def s3():
    from storage.server import EmbeddedS3

    server = EmbeddedS3.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def peers(s3):
    return {uid: s3.provision(f"reveal-peer{uid}") for uid in range(16)}


def payload_bytes(codec, hp, uid: int, seed: int | None = None) -> bytes:
    gen = torch.Generator().manual_seed(1000 + (uid if seed is None else seed))
    update = codec.compress({n: torch.randn(s, generator=gen) for n, s in codec.shapes.items()}, 0)
    return encode_payload(codec, update, torch.zeros(hp.sync_samples), PayloadMeta(uid, W, hp.protocol_version,
                                                                                    hp.digest()))


def last_modified(peer, key: str) -> float:
    return peer.write_client().head(peer.bucket, key).last_modified


def windows_around(commit_lm: float) -> tuple[PutWindow, PutWindow]:
    """A put window whose close is half a second after the commitment's LastModified: objects uploaded in the
    same or the next second count as revealed in the reveal window that follows it."""
    put = PutWindow(W, commit_lm - 3.0, commit_lm + 0.5)
    return put, reveal_window_after(put)


def fetch(hp, codec, peer, uid, put, reveal):
    return fetch_revealed(peer.read_client(), peer.bucket, keys.gradient(W, uid, hp.protocol_version), codec,
                          Expect.from_hparams(hp, W).for_uid(uid), reveal, math.inf, put=put)[0]


# ------------------------------------------------------------------ pure pieces
def test_reveal_window_follows_the_put_window_and_reveals_wait_for_the_look_at_the_commitments():
    put = PutWindow(3, 100.0, 103.4)
    after = reveal_window_after(put)
    # as long as the put window, plus the second the reveals wait for the validators' look at the commitments
    assert (after.window, after.open, after.close) == (3, 103.4, pytest.approx(107.8))
    assert certain_after(put.close) == pytest.approx(104.25)  # a commitment absent from here on was made late
    assert commit_look_ends(put) == pytest.approx(105.0)
    assert reveal_time(put) == pytest.approx(105.05)          # nobody reveals before the look is over
    # a commitment made after reading a reveal carries LastModified >= floor(105.05) = 105 > close: too late
    assert put.classify(math.floor(reveal_time(put))) == "late"
    assert reveal_window_after(put).classify(math.floor(reveal_time(put))) == "ok"
    # an honest reveal has as long to land as before the look existed (when it revealed at ⌊close⌋ + 1.05 s)
    assert after.close - reveal_time(put) == pytest.approx(put.close + 3.4 - (math.floor(put.close) + 1.05))


def test_clock_gathers_after_the_reveal_window_with_commit_reveal():
    from dso.protocol.clock import Clock

    class Chain:  # block b at 1000 + 0.5·b seconds
        def block_timestamp(self, block):
            return 1000 + 0.5 * block

    clock = Clock(Chain(), blocks_per_window=16, put_window_seconds=3.0)
    assert clock.put_window(2) == PutWindow(2, 1024.0, 1027.0)          # opens at the first block of window 3
    assert clock.reveal_window(2) == PutWindow(2, 1027.0, 1031.0)
    assert clock.uploads_close(2, commit_reveal=False) == 1027.0
    assert clock.uploads_close(2, commit_reveal=True) == 1031.0


def test_objects_round_trip_and_reject_anything_else():
    c = "ab" * 32
    assert parse_commit(commit_object(W, 4, c), W, 4) == c
    assert parse_reveal(reveal_object(W, 4, b"\x01" * 32), W, 4) == b"\x01" * 32
    bad_commits = [commit_object(W, 5, c), commit_object(W + 1, 4, c), commit_object(W, 4, c.upper()),
                   commit_object(W, 4, c[:-2]), {**commit_object(W, 4, c), "extra": 1},
                   {**commit_object(W, 4, c), "uid": True}, {**commit_object(W, 4, c), "format": "x"}]
    for obj in bad_commits:
        assert parse_commit(obj, W, 4).reason == Reason.BAD_COMMITMENT, obj
    for obj in (reveal_object(W, 5, b"\x01" * 32), reveal_object(W, 4, b"\x01" * 31),
                {**reveal_object(W, 4, b"\x01" * 32), "nonce": "zz" * 32}):
        assert parse_reveal(obj, W, 4).reason == Reason.MALFORMED, obj
    assert keys.parse(keys.reveal(W, 4, 1)) == keys.ParsedKey("reveal", W, 1, uid=4)


def test_commit_reveal_needs_room_for_the_reveal():
    hp = HParams(commit_reveal=True, put_window_seconds=1.0)
    assert "put_window_seconds" in settings_problem(hp)
    hp.put_window_seconds = 3.0
    assert settings_problem(hp) is None
    assert settings_problem(HParams(put_window_seconds=1.0)) is None  # off: no constraint


# --------------------------------------------------------------------- verdicts
def test_honest_commit_then_reveal_is_accepted_with_the_commit_time(hp, codec, peers):
    peer, uid = peers[0], 0
    sealed = seal(payload_bytes(codec, hp, uid), W, uid)
    assert sealed.commitment == commitment_hash(W, uid, sealed.payload, sealed.nonce)
    put_commit(peer.write_client(), peer.bucket, sealed, hp.protocol_version)
    put_reveal(peer.write_client(), peer.bucket, sealed, hp.protocol_version)
    commit_lm = last_modified(peer, keys.commit(W, uid, hp.protocol_version))
    got = fetch(hp, codec, peer, uid, *windows_around(commit_lm))
    assert isinstance(got, Payload), got
    assert got.meta.uid == uid and got.last_modified == commit_lm


def test_each_offence_gets_its_reason(hp, codec, peers):
    v = hp.protocol_version
    cases = {}

    def case(uid, name):
        cases[uid] = name
        return peers[uid].write_client(), peers[uid].bucket

    # 1: payload + nonce without any commitment
    client, bucket = case(1, Reason.NO_COMMIT)
    s1 = seal(payload_bytes(codec, hp, 1), W, 1)
    put_reveal(client, bucket, s1, v)
    # 2: committed, never revealed
    client, bucket = case(2, Reason.NO_REVEAL)
    put_commit(client, bucket, seal(payload_bytes(codec, hp, 2), W, 2), v)
    # 3: reveals a different payload than it committed to
    client, bucket = case(3, Reason.REVEAL_MISMATCH)
    put_commit(client, bucket, seal(payload_bytes(codec, hp, 3), W, 3), v)
    put_reveal(client, bucket, seal(payload_bytes(codec, hp, 3, seed=77), W, 3), v)
    # 4: a copier: another peer's payload *and nonce*, committed blind under its own uid → cannot match
    client, bucket = case(4, Reason.REVEAL_MISMATCH)
    put_commit(client, bucket, seal(b"placeholder", W, 4), v)
    put_reveal(client, bucket, seal(s1.payload, W, 4, nonce=s1.nonce), v)
    # 5: neither
    case(5, Reason.MISSING)
    # 6: a commit object that is not one
    client, bucket = case(6, Reason.BAD_COMMITMENT)
    client.put(bucket, keys.commit(W, 6, v), encode_json({"commitment": "00" * 32}))
    # 7: a reveal object that is not one
    client, bucket = case(7, Reason.MALFORMED)
    s7 = seal(payload_bytes(codec, hp, 7), W, 7)
    put_commit(client, bucket, s7, v)
    put_reveal(client, bucket, s7, v)
    client.put(bucket, keys.reveal(W, 7, v), b'{"nonce": 1}')
    # 8: honest (the control)
    client, bucket = case(8, None)
    s8 = seal(payload_bytes(codec, hp, 8), W, 8)
    put_commit(client, bucket, s8, v)
    put_reveal(client, bucket, s8, v)
    # 9: the payload reveals fine but the metadata names another uid → format failure after the hash check
    client, bucket = case(9, Reason.METADATA_MISMATCH)
    s9 = seal(payload_bytes(codec, hp, 8, seed=9), W, 9)
    put_commit(client, bucket, s9, v)
    put_reveal(client, bucket, s9, v)

    for uid, want in cases.items():  # each peer's windows around its own first object (uploads take seconds)
        first = [o.last_modified for o in peers[uid].write_client().list(peers[uid].bucket)]
        put, reveal = windows_around(min(first, default=0.0))
        got = fetch(hp, codec, peers[uid], uid, put, reveal)
        if want is None:
            assert isinstance(got, Payload), (uid, got)
        else:
            assert not isinstance(got, Payload) and got.reason == want, (uid, got)


def test_timing_of_commitment_and_reveal(hp, codec, peers):
    peer, uid, v = peers[10], 10, hp.protocol_version
    sealed = seal(payload_bytes(codec, hp, uid), W, uid)
    put_commit(peer.write_client(), peer.bucket, sealed, v)
    put_reveal(peer.write_client(), peer.bucket, sealed, v)
    c = last_modified(peer, keys.commit(W, uid, v))
    p = last_modified(peer, keys.gradient(W, uid, v))
    assert p - c <= 3  # within seconds (the same or the next on a quiet machine); the verdicts below allow 3

    def verdict(put, reveal):
        got = fetch(hp, codec, peer, uid, put, reveal)
        return "ok" if isinstance(got, Payload) else got.reason

    put_ok = PutWindow(W, c - 3, c + 0.5)
    assert verdict(put_ok, reveal_window_after(put_ok)) == "ok"
    # the commitment landed after its put window closed → as if there were none
    late_commit = PutWindow(W, c - 4, c - 1.5)
    assert verdict(late_commit, PutWindow(W, c - 1.5, c + 3)) == Reason.NO_COMMIT
    # the commitment landed before the put window opened (more than the 1 s tolerance)
    assert verdict(PutWindow(W, c + 1.5, c + 3), PutWindow(W, p - 0.5, p + 3)) == Reason.NO_COMMIT
    # payload readable before the reveal window: exactly what a copier needs → too early
    assert verdict(put_ok, PutWindow(W, p + 1.5, p + 4)) == Reason.TOO_EARLY
    # revealed after the reveal window closed, commitment in time → not revealed
    assert verdict(put_ok, PutWindow(W, p - 5, p - 0.5)) == Reason.NO_REVEAL
    # revealed late without a timely commitment → too late
    assert verdict(late_commit, PutWindow(W, p - 5, p - 0.5)) == Reason.TOO_LATE


def test_gather_window_aggregation_set_is_the_same_for_every_reader(hp, codec, peers, s3):
    """Validator and miners call the same gather: identical payloads and verdicts from two readers."""
    v = hp.protocol_version
    sealed = {uid: seal(payload_bytes(codec, hp, uid), W, uid) for uid in (12, 13, 14, 15)}
    for uid in (12, 13, 14):  # all commitments first, then the reveals (15 reveals without committing)
        put_commit(peers[uid].write_client(), peers[uid].bucket, sealed[uid], v)
    commit_times = [last_modified(peers[u], keys.commit(W, u, v)) for u in (12, 13, 14)]
    for uid in (12, 13, 15):
        put_reveal(peers[uid].write_client(), peers[uid].bucket, sealed[uid], v)
    put = PutWindow(W, min(commit_times) - 3, max(commit_times) + 0.5)
    commitments = {uid: peers[uid].commitment() for uid in (12, 13, 14, 15)}
    commitments[5] = None
    results = [gather_window(W, commitments, codec, Expect.from_hparams(hp, W), put, 30,
                             GatherOptions(readers=ReaderCache(timeout=20, allow_loopback=True)), CommitReveal())
               for _ in range(2)]
    for result in results:
        assert sorted(result.payloads) == [12, 13]
        assert {u: r.reason for u, r in result.rejections.items()} == {
            5: Reason.MISSING, 14: Reason.NO_REVEAL, 15: Reason.NO_COMMIT}
    plain = gather_window(W, commitments, codec, Expect.from_hparams(hp, W), reveal_window_after(put), 30,
                          GatherOptions(readers=ReaderCache(timeout=20, allow_loopback=True)))
    assert 15 in plain.payloads  # without commit-reveal the same objects would have been taken


def test_the_look_at_the_reveal_deadline_accepts_an_honest_reveal(hp, codec, peers):
    """Regression: under commit-reveal the look reads the signature revealed with the
    payload; the payload read must carry the digest of that same signature object (its evidence), or every honest
    miner would be judged `changed`."""
    from dso.protocol import signatures
    from signing import hotkeys_of, wallet_of
    from storage.look import look

    peer, uid = peers[5], 5
    data = payload_bytes(codec, hp, uid)
    sealed = seal(data, W, uid, signature=signatures.sign_payload(wallet_of(uid), "", W, uid, data))
    put_commit(peer.write_client(), peer.bucket, sealed, hp.protocol_version)
    put_reveal(peer.write_client(), peer.bucket, sealed, hp.protocol_version)
    put, reveal = windows_around(last_modified(peer, keys.commit(W, uid, hp.protocol_version)))
    readers = ReaderCache(timeout=20, allow_loopback=True)
    found = look(W, {uid: peer.commitment()}, Expect.from_hparams(hp, W), reveal.close, readers=readers,
                 **NO_HURRY)
    assert sorted(found.seen) == [uid]
    result = gather_window(W, {uid: peer.commitment()}, codec, Expect.from_hparams(hp, W), put, 30.0,
                           GatherOptions(readers=readers, judge=found.judge, hotkeys=hotkeys_of([uid])), CommitReveal())
    assert sorted(result.payloads) == [uid], result.rejections
    got = result.payloads[uid]
    assert got.seen == found.started and got.evidence == found.seen[uid].evidence
    assert got.signature == sealed.signature and got.raw == data


def test_the_look_at_the_commitments_overrules_a_forged_last_modified(hp, codec, peers):
    """A peer serving its own bucket can stamp a late commitment inside the put window.  The validator's
    look at the commitments (before anyone reveals) decides instead: absent then → no_commit whatever the stamp;
    rewritten since → changed; seen then → the LastModified rule as before."""
    from storage.look import Look, look

    v, readers = hp.protocol_version, ReaderCache(timeout=20, allow_loopback=True)
    sealed = {uid: seal(payload_bytes(codec, hp, uid), W, uid) for uid in (1, 2, 3)}
    for uid, s in sealed.items():
        put_commit(peers[uid].write_client(), peers[uid].bucket, s, v, run=RUN)
    commitments = {uid: peers[uid].commitment() for uid in sealed}
    put, _ = windows_around(max(last_modified(peers[u], keys.commit(W, u, v, RUN)) for u in sealed))
    found = look(W, commitments, Expect.from_hparams(hp, W, run=RUN), put.close, readers=readers, **NO_HURRY,
                 key_for=lambda uid: keys.commit(W, uid, v, RUN))
    assert sorted(found.seen) == [1, 2, 3]
    # 2 rewrites its commitment after the look (to a copy of what it read); 3 was absent at the look: as a
    # forging server would show it, the stamp is inside the put window, but the look's HEAD found nothing
    put_commit(peers[2].write_client(), peers[2].bucket, seal(payload_bytes(codec, hp, 2, seed=5), W, 2), v,
               run=RUN)
    del found.seen[3]
    found.absent[3] = found.certain + 0.1
    # the gathers' put window takes in the rewrite's stamp, which may fall a second later: the forging server
    # would stamp it inside the window, and without this the plain gather's verdict on 2 hung on the clock
    put, _ = windows_around(max(last_modified(peers[u], keys.commit(W, u, v, RUN)) for u in sealed))
    for uid, s in sealed.items():
        put_reveal(peers[uid].write_client(), peers[uid].bucket, s, v, run=RUN)
    result = gather_window(W, commitments, codec, Expect.from_hparams(hp, W, run=RUN), put, 30.0,
                           GatherOptions(readers=readers), CommitReveal(found))
    assert sorted(result.payloads) == [1], result.rejections
    assert {u: r.reason for u, r in result.rejections.items()} == {2: Reason.CHANGED, 3: Reason.NO_COMMIT}
    assert "commitment absent when the validator looked" in result.rejections[3].detail
    # without the look, the stamps alone would have taken 3 (and 2's rewritten commitment fails only its hash)
    plain = gather_window(W, commitments, codec, Expect.from_hparams(hp, W, run=RUN), put, 30.0,
                          GatherOptions(readers=readers), CommitReveal())
    assert sorted(plain.payloads) == [1, 3] and plain.rejections[2].reason == Reason.REVEAL_MISMATCH
    # a look that found nothing certain (asked too early, or no answer) leaves the stamp to decide
    early = Look(W, put.close, found.certain, absent={3: found.certain - 0.5}, unanswered={1})
    assert sorted(gather_window(W, {1: commitments[1], 3: commitments[3]}, codec,
                                Expect.from_hparams(hp, W, run=RUN), put, 30.0, GatherOptions(readers=readers),
                                CommitReveal(early)).payloads) == [1, 3]
