"""Signed payloads on a real S3 server: every payload carries its miner's sr25519 signature over (run, window,
uid, sha256 of the bytes), published as its own object; a gather that knows the uids' hotkeys refuses anything
else with a reason, and never raises.  The message and the object's parsing are tested in process in
tests/unit/storage/test_signatures.py."""
from __future__ import annotations

import hashlib

from dso.chain.wallets import dev_wallet
from dso.protocol import signatures
from dso.protocol.payload import Payload
from dso.protocol.rejections import Reason
from signing import hotkeys_of, put_signed, wallet_of
from st_craft import honest
from storage import keys, signature
from storage.gather import GatherOptions, ReaderCache, gather
from storage.wire import Expect

WINDOW = 12
RUN = "5eed5eed5eed5eed"


def test_gather_refuses_unsigned_and_wrongly_signed_payloads_with_a_reason(s3, codec, make_update, hp):
    """One peer per way a signature can fail, on a real S3 server; the honest peer's payload keeps its bytes,
    digest and signature (a bundle carries them).  Without hotkeys (a tool's read) signatures are not checked."""
    uids = range(10)
    creds = {uid: s3.provision(f"signed{uid}") for uid in uids}
    data = {uid: honest(codec, make_update(40 + uid), hp, uid, WINDOW) for uid in uids}
    v = hp.protocol_version

    def put_object(uid: int, obj: bytes) -> None:
        creds[uid].write_client().put(creds[uid].bucket, keys.signature(WINDOW, uid, v, RUN), obj)

    def payload_only(uid: int) -> None:
        creds[uid].write_client().put(creds[uid].bucket, keys.gradient(WINDOW, uid, v, RUN), data[uid])

    def signed_by(uid: int, *, wallet=None, run: str = RUN, window: int = WINDOW, over: bytes | None = None) -> None:
        sig = signatures.sign_payload(wallet or wallet_of(uid), run, window, uid, over or data[uid])
        put_object(uid, signature.encode(RUN, WINDOW, uid, signatures.digest(over or data[uid]), sig))
        payload_only(uid)

    put_signed(creds[0].write_client(), creds[0].bucket, hp, 0, WINDOW, data[0], run=RUN)
    payload_only(1)                                               # no signature object
    signed_by(2, wallet=dev_wallet("//not-uid-2"))                # another key
    signed_by(3, over=data[4])                                    # a signature of other bytes
    signed_by(4, window=WINDOW - 1)                               # made for another window
    signed_by(5, run="f" * 16)                                    # made for another run
    signed_by(6)                                                  # uid 6 has no hotkey on chain
    put_object(7, b"{garbage")
    payload_only(7)
    put_object(8, signature.encode(RUN, WINDOW, 9, signatures.digest(data[8]), "c" * 128))  # claims uid 9
    payload_only(8)
    signed_by(9, wallet=wallet_of(9))                             # honest too, signed by its own key
    hotkeys = {u: h for u, h in hotkeys_of(uids).items() if u != 6}
    commitments = {uid: c.commitment() for uid, c in creds.items()}
    readers = ReaderCache(allow_loopback=True)
    result = gather(WINDOW, commitments, codec, Expect.from_hparams(hp, WINDOW, run=RUN), None, 60,
                    GatherOptions(readers=readers, hotkeys=hotkeys))
    assert sorted(result.payloads) == [0, 9], result.rejections
    got = {u: (r.reason, r.detail) for u, r in result.rejections.items()}
    assert got[1][0] == Reason.UNSIGNED
    assert got[2][0] == Reason.BAD_SIGNATURE and "not signed by uid 2" in got[2][1]
    assert got[3][0] == Reason.BAD_SIGNATURE and "covers" in got[3][1]
    for uid in (4, 5):
        assert got[uid][0] == Reason.BAD_SIGNATURE and "not signed by" in got[uid][1], got[uid]
    assert got[6][0] == Reason.BAD_SIGNATURE and "no hotkey" in got[6][1]
    assert got[7][0] == Reason.MALFORMED and "signature object" in got[7][1]
    assert got[8][0] == Reason.METADATA_MISMATCH and "uid" in got[8][1]
    honest_payload = result.payloads[0]
    assert isinstance(honest_payload, Payload) and honest_payload.raw == data[0]
    assert honest_payload.sha256 == hashlib.sha256(data[0]).hexdigest() and signatures.is_signature(
        honest_payload.signature)
    unchecked = gather(WINDOW, commitments, codec, Expect.from_hparams(hp, WINDOW, run=RUN), None, 60,
                       GatherOptions(readers=readers))
    assert {1, 2, 3, 4, 5, 6, 7, 8} <= set(unchecked.payloads)   # the bytes themselves are all well formed
