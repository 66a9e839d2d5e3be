"""The validator's look at the close of the uploads (storage/look.py): what it may and may not decide."""
from __future__ import annotations

import math
import random
import socket
import time

import torch

from dso.protocol.clock import PutWindow
from dso.protocol.payload import Payload
from dso.protocol.rejections import Reason, Rejection
from signing import hotkeys_of, put_signed
from st_craft import honest
from storage.commitment import BucketInfo
from storage.gather import GatherOptions, ReaderCache, gather
from storage.look import LOOK_MARGIN_SECONDS, Look, Seen, certain_after, look
from storage.wire import Expect

WINDOW = 6


def _payload(evidence: str = "e1") -> Payload:
    return Payload(meta={}, update=None, sync_values=torch.zeros(1), nbytes=10, evidence=evidence)  # type: ignore[arg-type]


def test_certain_after_is_the_first_second_an_honest_server_stamps_late():
    """An object absent at a look sent at certain_after(close) was written later than that minus the skew
    allowance; on an honest server (whole-second LastModified, truncated) it is then stamped after the close.
    Oracle: PutWindow.classify, the LastModified rule the look must never be stricter than."""
    assert certain_after(100.0) == 101.0 + LOOK_MARGIN_SECONDS
    assert certain_after(100.2) == certain_after(100.99) == 101.0 + LOOK_MARGIN_SECONDS
    rng = random.Random(17)
    for _ in range(20_000):
        close = rng.uniform(1e9, 1e9 + 1e4)
        put = PutWindow(0, close - 10.0, close)
        written = certain_after(close) - LOOK_MARGIN_SECONDS + rng.uniform(0.0, 5.0)  # absent at the look
        assert put.classify(math.floor(written)) == "late"
    # and an object written just before that moment may still be stamped in time: the look must not decide it
    assert PutWindow(0, 90.0, 100.2).classify(math.floor(certain_after(100.2) - LOOK_MARGIN_SECONDS - 0.01)) == "ok"


def test_judge_decides_seen_changed_and_certainly_absent_and_nothing_else():
    close = 1000.4
    seen = Seen("e1", 10, 1001.3, 1001.31)
    found = Look(WINDOW, close, certain_after(close), started=1001.25, seen={1: seen},
                 absent={2: 1001.3, 3: 1001.0}, unanswered={4})
    ok = found.judge(1, _payload())
    assert isinstance(ok, Payload) and ok.seen == 1001.25
    changed = found.judge(1, _payload(evidence="e2"))
    assert isinstance(changed, Rejection) and changed.reason == Reason.CHANGED
    late = found.judge(2, _payload())
    assert isinstance(late, Rejection) and late.reason == Reason.TOO_LATE and "0.90 s" in late.detail
    # absent to a HEAD sent before the certain moment, no answer, or never looked at: the LastModified rule alone
    for uid in (3, 4, 5):
        kept = found.judge(uid, _payload())
        assert isinstance(kept, Payload) and kept.seen == 1001.25, uid
    missing = Rejection(Reason.MISSING, "gone")
    assert found.judge(1, missing) is missing


def test_look_then_gather_on_a_real_server(s3, codec, make_update, hp):
    """Signatures seen count; one re-signed after the look is CHANGED; one absent at the look is TOO_LATE; a peer
    whose server did not answer the look (a hang) is left to the LastModified rule, never made late."""
    creds = {uid: s3.provision(f"look{uid}") for uid in range(5)}
    data = {uid: honest(codec, make_update(300 + uid), hp, uid, WINDOW) for uid in range(5)}

    def put(uid: int, body: bytes) -> None:
        put_signed(creds[uid].write_client(), creds[uid].bucket, hp, uid, WINDOW, body)

    for uid in (0, 1, 2, 4):
        put(uid, data[uid])
    commitments = {uid: c.commitment() for uid, c in creds.items()}
    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(16)   # accepts connections in the kernel, never answers
    at_look = {**commitments, 4: BucketInfo(f"http://127.0.0.1:{hang.getsockname()[1]}", "us-east-1", "dso-hang",
                                            "AKIAFAKE", "s" * 40)}
    readers = ReaderCache(timeout=20, allow_loopback=True)
    close = time.time() - 2.0       # the uploads closed two seconds ago: the look is past its certain moment
    try:
        began = time.monotonic()
        found = look(WINDOW, at_look, Expect.from_hparams(hp, WINDOW), close, budget=3.0, peer_seconds=2.5,
                     readers=readers)
        took = time.monotonic() - began
    finally:
        hang.close()
    assert sorted(found.seen) == [0, 1, 2] and sorted(found.absent) == [3] and found.unanswered == {4}
    assert took < 3.0 + 2.5   # budget + join grace: a hanging server cannot hold the validator
    assert found.summary()["seen"] == 3 and found.summary()["started_after_close"] >= 2.0
    put(3, data[3])                                           # after the look
    put(2, honest(codec, make_update(999), hp, 2, WINDOW))   # rewritten after the look: a new signature
    result = gather(WINDOW, commitments, codec, Expect.from_hparams(hp, WINDOW), None, deadline_seconds=60,
                    options=GatherOptions(readers=readers, judge=found.judge, hotkeys=hotkeys_of(range(5))))
    assert sorted(result.payloads) == [0, 1, 4]
    assert {u: r.reason for u, r in result.rejections.items()} == {2: Reason.CHANGED, 3: Reason.TOO_LATE}
    assert {p.seen for p in result.payloads.values()} == {found.started}   # seen together: no order among them


def test_watch_orders_uploads_by_first_sight_and_a_rewrite_loses_its_place(s3, codec, make_update, hp):
    """While uploads are open the validator reads every interval the signatures of peers it has not seen: an
    author that signed before a copier is first seen a round earlier, whatever either server reports; a signature
    rewritten after it was first seen takes the look's time (a copier cannot hold an early place with a
    placeholder)."""
    from storage.look import watch

    creds = {uid: s3.provision(f"watch{uid}") for uid in range(3)}
    data = {uid: honest(codec, make_update(500 + uid), hp, uid, WINDOW) for uid in range(3)}

    def put(uid: int, body: bytes) -> None:
        put_signed(creds[uid].write_client(), creds[uid].bucket, hp, uid, WINDOW, body)

    put(0, data[0])          # the author, before the watch begins
    put(2, data[2])          # a placeholder, rewritten below
    commitments = {uid: c.commitment() for uid, c in creds.items()}
    readers = ReaderCache(timeout=20, allow_loopback=True)
    expect = Expect.from_hparams(hp, WINDOW)
    rounds = []

    def upload_after_the_first_round() -> bool:  # watch asks before every round: the uploads land between 1 and 2
        rounds.append(time.time())
        if len(rounds) == 2:
            put(1, data[1])
            put(2, honest(codec, make_update(777), hp, 2, WINDOW))
        return False

    # rounds 3 s apart: each request of a round has that long (a loaded machine), and the uploads land between rounds
    first = watch(WINDOW, commitments, expect, time.time() + 12.0, interval=3.0, readers=readers,
                  stop=upload_after_the_first_round)
    assert sorted(first) == [0, 1, 2] and first[0].asked < first[1].asked
    found = look(WINDOW, commitments, expect, time.time() - 2.0, budget=10.0, peer_seconds=10.0, readers=readers)
    found.first = first
    result = gather(WINDOW, commitments, codec, expect, None, deadline_seconds=60,
                    options=GatherOptions(readers=readers, judge=found.judge, hotkeys=hotkeys_of(range(3))))
    assert sorted(result.payloads) == [0, 1, 2], result.rejections
    seen = {u: p.seen for u, p in result.payloads.items()}
    assert seen[0] == first[0].asked < seen[1] == first[1].asked < found.started
    # uid 2 was first seen in the first round, but with the placeholder's signature: its time is the look's
    assert first[2].asked == first[0].asked and seen[2] == found.started
    assert found.summary()["watched"] == 3
