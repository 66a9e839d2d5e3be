"""One helper words the rejection for an exception a check did not foresee (dso.protocol.rejections.unexpected)."""
from __future__ import annotations

import re
import time

from dso.codec.demo import DeMoCodec
from dso.protocol.rejections import UNEXPECTED_DETAIL_CHARS, Reason, Rejection, unexpected
from repo import ROOT
from storage.gather import fetch_payload
from storage.reveal import fetch_revealed
from storage.wire import Expect, decode_payload


def test_unexpected_names_the_exception_and_caps_its_message():
    r = unexpected(Reason.MALFORMED, KeyError("x" * 1000))
    assert r.reason is Reason.MALFORMED
    assert r.detail.startswith("unexpected KeyError: 'xxx")
    assert len(r.detail) == len("unexpected KeyError: ") + UNEXPECTED_DETAIL_CHARS
    assert unexpected(Reason.UNREACHABLE, RuntimeError("boom")) == Rejection(Reason.UNREACHABLE,
                                                                              "unexpected RuntimeError: boom")


class _Boom(Exception):
    pass


class _BrokenCodec(DeMoCodec):
    def wire_spec(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        raise _Boom("codec bug")


class _HostileClient:
    def head(self, bucket: str, key: str, deadline: float | None = None) -> object:
        raise _Boom("server sent nonsense")


def test_decode_and_fetch_reject_an_unforeseen_exception_through_the_helper():
    expect = Expect(window=3, protocol_version=1, hparams_digest="ab", sync_samples=4)
    got = decode_payload(b"not read", _BrokenCodec({"w": (8, 8)}), expect)
    assert got == unexpected(Reason.MALFORMED, _Boom("codec bug"))

    outcome, downloaded = fetch_payload(_HostileClient(), "b", "k", DeMoCodec({"w": (8, 8)}),
                                        expect, None, time.monotonic() + 5)
    assert (outcome, downloaded) == (unexpected(Reason.UNREACHABLE, _Boom("server sent nonsense")), 0)


def test_a_commit_reveal_fetch_without_a_uid_reads_nothing():
    """Without Expect.for_uid the keys would name uid None: refused before any request."""
    from dso.protocol.clock import PutWindow

    expect = Expect(window=3, protocol_version=1, hparams_digest="ab", sync_samples=4)  # no uid
    put = PutWindow(window=3, open=0.0, close=1.0)
    got, downloaded = fetch_revealed(_HostileClient(), "b", "k", DeMoCodec({"w": (8, 8)}), expect, put,
                                     time.monotonic() + 5, put=put)
    assert downloaded == 0 and got.reason is Reason.UNREACHABLE and "Expect.for_uid" in got.detail


def test_no_module_words_the_message_itself():
    """Every rejection for an unforeseen exception goes through the helper (dso/protocol/rejections.py)."""
    pattern = re.compile(r"unexpected \{type\(")
    offenders = [str(p.relative_to(ROOT)) for pkg in ("dso", "storage", "scoring", "neurons")
                 for p in sorted((ROOT / pkg).rglob("*.py"))
                 if p.name != "rejections.py" and pattern.search(p.read_text())]
    assert offenders == []
