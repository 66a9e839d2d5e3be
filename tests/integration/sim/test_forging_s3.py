"""The forging S3 proxy of the backdater and hider (sim/forging_s3.py): readers' signed requests pass through,
and every LastModified they see is moved by the forger's shift."""
from __future__ import annotations

from dataclasses import replace

import pytest

from sim.forging_s3 import ForgingS3, forge_http_date, forge_iso_date, forge_listing, shifted_by
from storage.client import StorageError
from storage.commitment import BucketInfo
from storage.gather import ReaderCache

SHIFT = -3.0
FORGE = shifted_by(SHIFT)


def test_http_dates_move_by_the_shift():
    assert forge_http_date("Thu, 26 Nov 2026 21:30:05 GMT", FORGE) == "Thu, 26 Nov 2026 21:30:02 GMT"
    assert forge_http_date("Thu, 26 Nov 2026 00:00:01 GMT", FORGE) == "Wed, 25 Nov 2026 23:59:58 GMT"
    assert forge_http_date("not a date", FORGE) == "not a date"


def test_listing_times_move_and_are_counted():
    assert forge_iso_date("2026-11-26T21:30:05.250Z", FORGE) == "2026-11-26T21:30:02.250Z"
    body = (b"<ListBucketResult><Contents><Key>a</Key><LastModified>2026-11-26T21:30:05.000Z</LastModified>"
            b"</Contents><Contents><Key>b</Key><LastModified>2026-11-26T21:30:09.500Z</LastModified></Contents>"
            b"</ListBucketResult>")
    moved, count = forge_listing(body, FORGE)
    assert count == 2
    assert b"2026-11-26T21:30:02.000Z" in moved and b"2026-11-26T21:30:06.500Z" in moved
    assert b"21:30:05" not in moved


@pytest.fixture(scope="module")
def peer():
    from storage.server import EmbeddedS3

    server = EmbeddedS3.start()
    creds = server.provision("forger")
    yield creds
    server.stop()


def test_signed_reads_through_the_proxy_see_forged_times(peer):
    """HEAD, GET and LIST through the proxy answer with the real object and a LastModified SHIFT seconds
    earlier; a wrong read key is still refused by the real server behind it."""
    writer = peer.write_client()
    writer.put(peer.bucket, "w/1.bin", b"x" * 1234)
    true_time = writer.head(peer.bucket, "w/1.bin").last_modified
    readers = ReaderCache(allow_loopback=True)
    with ForgingS3(peer.endpoint, FORGE) as forger:
        info = BucketInfo(forger.endpoint, peer.region, peer.bucket, peer.read_key_id, peer.read_secret)
        client = readers.get(info)
        head = client.head(peer.bucket, "w/1.bin")
        assert (head.size, head.last_modified) == (1234, true_time + SHIFT)
        data, got = client.get_with_info(peer.bucket, "w/1.bin")
        assert data == b"x" * 1234 and got.last_modified == true_time + SHIFT
        [listed] = client.list(peer.bucket, "w/")
        assert listed.key == "w/1.bin" and abs(listed.last_modified - (true_time + SHIFT)) < 1.0
        assert forger.forged >= 3
        wrong = readers.get(replace(info, secret_access_key="not-the-secret"))
        with pytest.raises(StorageError) as refused:  # the proxy passes the bad signature on; S3 refuses it
            wrong.head(peer.bucket, "w/1.bin")
        assert refused.value.kind == "denied", refused.value


def test_a_forger_claims_the_earliest_second_of_the_window_it_wrote_for():
    """Up to BACKDATE_BY (3 s) early, but not before the put window's open (that would only be too_early); the
    real server's stamps are whole seconds, so a stamp in the second the window opened is this window's."""
    from sim.behaviours import forged_time

    assert forged_time(105.2, opened=100.4) == 102.2        # 3 s early is still inside the window
    assert forged_time(102.7, opened=100.4) == 101.0        # clamped to the first whole second after the open
    assert forged_time(100.0, opened=100.4) == 100.0        # stamped in the opening second (truncated): as it is
    assert forged_time(99.0, opened=100.4) == 96.0          # written before this window opened: plain shift
    assert forged_time(50.0, opened=None) == 47.0
