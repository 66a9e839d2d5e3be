"""gather's knobs travel in one GatherOptions; each one reaches the pipeline (jobs → worker pool → results).
The per-peer fetch is replaced by a recording one, so no socket is opened; the S3 path is the integration tier's."""
from __future__ import annotations

import threading
import time

import pytest

from dso.protocol.rejections import Reason, Rejection
from storage.commitment import BucketInfo
from storage.gather import DEFAULT_OPTIONS, DEFAULT_PER_HOST, DEFAULT_WORKERS, GatherOptions, ReaderCache, gather
from storage.wire import Expect

WINDOW = 6
RUN = "0123456789abcdef"


def _info(port: int) -> BucketInfo:
    return BucketInfo(f"http://127.0.0.1:{port}", "us-east-1", f"dso-peer-{port}", "AKIAPEER", "s" * 40)


class Recorder:
    """A fetch that answers each uid with a chosen reason and byte count, and remembers the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[int | None, str | None, str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, client, bucket, key, codec, expect, put_window, deadline):
        with self.lock:
            self.calls.append((expect.uid, expect.signer, bucket, key))
        if expect.uid == 13:
            raise RuntimeError("a hostile answer the fetch did not expect")
        return Rejection(Reason.MALFORMED, f"uid {expect.uid}"), 100 + (expect.uid or 0)


def test_defaults_are_the_nodes():
    assert DEFAULT_OPTIONS.max_workers == DEFAULT_WORKERS == 32
    assert DEFAULT_OPTIONS.max_per_host == DEFAULT_PER_HOST == 8
    assert DEFAULT_OPTIONS.min_peer_seconds == 1.0
    assert DEFAULT_OPTIONS.priority is None and DEFAULT_OPTIONS.hotkeys is None and DEFAULT_OPTIONS.judge is None


@pytest.mark.parametrize("bad", [{"max_workers": 0}, {"max_per_host": 0}, {"min_peer_seconds": -1.0}])
def test_options_refuse_nonsense(bad):
    with pytest.raises(ValueError, match="must be >= 1"):
        GatherOptions(**bad)


def test_every_option_reaches_the_pipeline(codec, hp):
    fetch = Recorder()
    peers: dict[int, BucketInfo | str | None] = {1: _info(9001), 2: _info(9002), 5: None, 7: "not a commitment",
                                                 9: _info(9009), 13: _info(9013)}
    judged: list[int] = []

    def judge(uid, outcome):
        judged.append(uid)
        return Rejection(Reason.CHANGED, "judged") if uid == 2 else outcome

    options = GatherOptions(readers=ReaderCache(allow_loopback=True), fetch=fetch, priority=[9, 2], max_workers=1,
                            hotkeys={1: "hk-1", 2: "hk-2"}, judge=judge)
    result = gather(WINDOW, peers, codec, Expect.from_hparams(hp, WINDOW, run=RUN), None, 30, options)

    # one worker: the peers start in priority order, then by uid; those without a usable commitment never start
    assert [uid for uid, *_ in fetch.calls] == [9, 2, 1, 13]
    assert {uid: signer for uid, signer, *_ in fetch.calls} == {9: "", 2: "hk-2", 1: "hk-1", 13: ""}
    assert fetch.calls[0][2:] == ("dso-peer-9009", f"{RUN}/gradient/{WINDOW}/9-v{hp.protocol_version}.safetensors")
    assert sorted(judged) == [1, 2, 9]  # the peer whose fetch raised is UNREACHABLE without a judge's say
    reasons = {uid: r.reason for uid, r in result.rejections.items()}
    assert reasons == {1: Reason.MALFORMED, 2: Reason.CHANGED, 5: Reason.MISSING, 7: Reason.BAD_COMMITMENT,
                       9: Reason.MALFORMED, 13: Reason.UNREACHABLE}
    assert result.payloads == {}
    assert result.bytes_down == 101 + 102 + 109
    assert sorted(result.finished) == [1, 2, 9, 13]


def test_signatures_unchecked_without_hotkeys(codec, hp):
    fetch = Recorder()
    gather(WINDOW, {1: _info(9001)}, codec, Expect.from_hparams(hp, WINDOW), None, 30,
           GatherOptions(readers=ReaderCache(allow_loopback=True), fetch=fetch))
    assert [(uid, signer) for uid, signer, *_ in fetch.calls] == [(1, None)]


def test_a_peer_past_the_budget_is_a_timeout(codec, hp):
    def slow(client, bucket, key, codec, expect, put_window, deadline):
        time.sleep(max(0.0, deadline - time.monotonic()) + 1.0)  # ends well after its deadline, inside the grace
        return Rejection(Reason.MALFORMED, "too late to count"), 50

    result = gather(WINDOW, {4: _info(9004)}, codec, Expect.from_hparams(hp, WINDOW), None, 0.3,
                    GatherOptions(readers=ReaderCache(allow_loopback=True), fetch=slow))
    assert result.rejections[4].reason is Reason.TIMEOUT and "0.3 s" in result.rejections[4].detail
    assert result.bytes_down == 0 and result.finished == {}


def test_expect_must_be_for_the_window(codec, hp):
    with pytest.raises(ValueError, match="gathering window"):
        gather(WINDOW + 1, {}, codec, Expect.from_hparams(hp, WINDOW), None, 1)
