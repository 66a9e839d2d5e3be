"""Signed payloads, in process: the message a miner's hotkey signs (run, window, uid, sha256 of the bytes), its
verification with a reason, and the strict parsing of the signature object; the gather's refusals on a real S3
server are in tests/integration/storage/test_storage_signatures.py."""
from __future__ import annotations

import hashlib
import json

import pytest

from dso.chain.wallets import dev_wallet, hotkey_address
from dso.protocol import signatures
from dso.protocol.rejections import Reason, Rejection
from signing import wallet_of
from storage import signature

WINDOW = 12
RUN = "5eed5eed5eed5eed"


def test_the_signed_message_names_run_window_uid_and_digest_and_verifies_only_for_them():
    wallet = wallet_of(3)
    hotkey = hotkey_address(wallet)
    data = b"payload bytes"
    sig = signatures.sign_payload(wallet, RUN, WINDOW, 3, data)
    digest = hashlib.sha256(data).hexdigest()
    assert signatures.message(RUN, WINDOW, 3, digest) == (
        b'dso-payload-signature/v1:{"run":"5eed5eed5eed5eed","sha256":"' + digest.encode()
        + b'","uid":3,"window":12}')
    assert signatures.signature_problem(hotkey, RUN, WINDOW, 3, digest, sig) is None
    for run, window, uid, sha in (("0" * 16, WINDOW, 3, digest), (RUN, WINDOW + 1, 3, digest),
                                  (RUN, WINDOW, 4, digest), (RUN, WINDOW, 3, "0" * 64)):
        assert "not signed by" in signatures.signature_problem(hotkey, run, window, uid, sha, sig)
    other = hotkey_address(dev_wallet("//someone-else"))
    assert "not signed by" in signatures.signature_problem(other, RUN, WINDOW, 3, digest, sig)
    assert "no hotkey" in signatures.signature_problem("", RUN, WINDOW, 3, digest, sig)
    assert "hex" in signatures.signature_problem(hotkey, RUN, WINDOW, 3, digest, sig[:-2])


@pytest.mark.parametrize("change, reason, words", [
    ({"format": "dso-signature/v0"}, Reason.MALFORMED, "format"),
    ({"signature": "zz" * 64}, Reason.MALFORMED, "signature is not"),
    ({"sha256": "A" * 64}, Reason.MALFORMED, "sha256"),
    ({"extra": 1}, Reason.MALFORMED, "keys"),
    ({"window": WINDOW + 1}, Reason.METADATA_MISMATCH, "window"),
    ({"uid": 4}, Reason.METADATA_MISMATCH, "uid"),
    ({"uid": True}, Reason.METADATA_MISMATCH, "uid"),
    ({"run": "f" * 16}, Reason.METADATA_MISMATCH, "run"),
])
def test_signature_objects_are_parsed_strictly(change, reason, words):
    good = json.loads(signature.encode(RUN, WINDOW, 3, "a" * 64, "b" * 128))
    assert isinstance(signature.parse(json.dumps(good).encode(), RUN, WINDOW, 3), signature.Signed)
    bad = signature.parse(json.dumps({**good, **change}).encode(), RUN, WINDOW, 3)
    assert isinstance(bad, Rejection) and bad.reason == reason and words in bad.detail, bad
    assert signature.parse(b"{" * 2000, RUN, WINDOW, 3).reason == Reason.TOO_LARGE
    assert signature.parse(b"not json", RUN, WINDOW, 3).reason == Reason.MALFORMED
