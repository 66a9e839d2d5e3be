"""Authorship no endpoint can fake, through the validator's real watch, look and gather on the embedded
S3 server, the real copy detection and the real scoring.

Three honest miners publish signed payloads (the signature, then the payload a lead later, as neurons/publish.py
does, with room for a loaded test machine: LEAD_SECONDS); a copier publishes its own endpoint (sim/copying_s3.py)
that serves the author's update under the copier's uid the instant the author's payload exists, signed with the
copier's own key, with the author's ETag and Last-Modified pinned — and, in half the windows, placeholders before
that (a pinned HEAD, a signature and a commitment of nothing).  The copy tie-break is rigged for the copier
(whenever two are seen together, the copier is taken for the author), so only the validator's own first sight of
the signatures decides.  Without commit-reveal and with it, the author is never rejected, the copier is rejected
every window, and after the windows the author holds weight and the copier none."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest

from dso.protocol import signatures
from dso.protocol.clock import PutWindow, certain_after, commit_look_ends, reveal_time, reveal_window_after
from mininet import MiniNet, chain_randomness, eval_seed
from scoring import ValidatorState, score_window
from scoring.copies import find_copies
from scoring.window import Scorer, WindowEvidence
from signing import hotkeys_of, wallet_of
from sim.copying_s3 import CopyingS3
from storage import keys, signature
from storage.commitment import BucketInfo, parse_commitment
from storage.gather import GatherOptions, ReaderCache
from storage.look import SIGNATURE_LEAD_SECONDS, look, watch
from storage.reveal import CommitReveal, gather_window, put_commit, put_reveal, seal
from storage.server import EmbeddedS3
from storage.wire import Expect, encode_payload

AUTHOR, OTHERS, COPIER = 0, (1, 2), 3
HONEST = (AUTHOR, *OTHERS)
# the protocol's lead is two watch rounds and a margin; a validator starved for more than that (a loaded 2-core test
# machine) first sees the author's signature together with the copy's: the test gives it a second more, and the
# payloads (in by ~3 s) the rest of the put window
LEAD_SECONDS = SIGNATURE_LEAD_SECONDS + 1.0
PUT_SECONDS = 5.0
SECRET = "a7" * 16


def rigged_for_the_copier(tied, update, group):
    """The copy tie-break at its worst for the author: among members seen together, the copier keeps it."""
    return {u: (1.0 if u == COPIER else 0.0) for u in tied}


@dataclass
class Outcome:
    verdicts: dict[int, list[str]] = field(default_factory=dict)   # uid → its verdict per window
    weights: dict[int, float] = field(default_factory=dict)


@pytest.fixture(scope="module")
def s3():
    server = EmbeddedS3.start()
    yield server
    server.stop()


def publish(creds, hp, uid: int, window: int, data: bytes, at: float) -> None:
    """An honest miner's plain upload: its signature at ``at``, the payload LEAD_SECONDS later."""
    time.sleep(max(0.0, at - time.time()))
    client = creds.write_client()
    sig = signatures.sign_payload(wallet_of(uid), "", window, uid, data)
    signature.put(client, creds.bucket, "", window, uid, hp.protocol_version, signatures.digest(data), sig)
    time.sleep(LEAD_SECONDS)
    client.put(creds.bucket, keys.gradient(window, uid, hp.protocol_version), data)


def commit_then_reveal(creds, hp, uid: int, window: int, data: bytes, put: PutWindow, looked: threading.Event) -> None:
    """An honest miner's commitment, then its reveal at reveal_time — and not before the validator's look at the
    commitments is over (``looked``): on a loaded machine that look may run past its end, which in the protocol
    only a validator too slow for its own schedule risks."""
    time.sleep(max(0.0, put.open + 0.2 - time.time()))
    sealed = seal(data, window, uid, signature=signatures.sign_payload(wallet_of(uid), "", window, uid, data))
    put_commit(creds.write_client(), creds.bucket, sealed, hp.protocol_version)
    time.sleep(max(0.0, reveal_time(put) - time.time()))
    looked.wait(30)
    put_reveal(creds.write_client(), creds.bucket, sealed, hp.protocol_version)


def one_window(s3, hp, net, creds, copier: CopyingS3, window: int, commit_reveal: bool):
    """What the validator's transport and copy detection make of window ``window``: (payloads, rejections)."""
    peers = {**{u: creds[u].commitment() for u in HONEST},
             COPIER: BucketInfo(copier.endpoint, "us-east-1", "dso-copier", "AKIACOPIER", "s" * 40)}
    updates = net.payloads(window)
    data = {u: encode_payload(net.codec, updates[u].update, updates[u].sync_values, updates[u].meta) for u in HONEST}
    opened = time.time() + 0.3
    put = PutWindow(window, opened, opened + PUT_SECONDS)
    readers, expect = ReaderCache(timeout=5, allow_loopback=True), Expect.from_hparams(hp, window)
    looked = threading.Event()
    if commit_reveal:
        workers = [threading.Thread(target=commit_then_reveal, args=(creds[u], hp, u, window, data[u], put, looked))
                   for u in HONEST]
    else:  # the author first; the others a little later
        workers = [threading.Thread(target=publish, args=(creds[u], hp, u, window, data[u], opened + 0.1 + 0.15 * i))
                   for i, u in enumerate(HONEST)]
    for w in workers:
        w.start()
    commitments_look = None
    if commit_reveal:
        time.sleep(max(0.0, certain_after(put.close) - time.time()))
        # the protocol's look budget (0.75 s) and a second and a half for a loaded machine (the reveals wait for it)
        budget = max(0.0, commit_look_ends(put) - time.time()) + 1.5
        commitments_look = look(window, peers, expect, put.close, budget=budget, peer_seconds=budget,
                                readers=readers, key_for=lambda uid: keys.commit(window, uid, hp.protocol_version))
        looked.set()
        uploads = reveal_window_after(put)
    else:
        uploads = put
    time.sleep(max(0.0, uploads.close - PUT_SECONDS - time.time()))
    first = watch(window, peers, expect, uploads.close, readers=readers)
    for w in workers:
        w.join()
    time.sleep(max(0.0, certain_after(uploads.close) - time.time()))
    found = look(window, peers, expect, uploads.close, readers=readers)
    found.first = first
    got = gather_window(window, peers, net.codec, expect, put, 30.0,
                        GatherOptions(readers=readers, judge=found.judge, hotkeys=hotkeys_of(range(4))),
                        CommitReveal(commitments_look) if commit_reveal else None)
    rejections = dict(got.rejections)
    times = {u: p.seen for u, p in got.payloads.items() if p.seen is not None}
    rejections.update(find_copies(net.codec, {u: p.update for u, p in got.payloads.items()}, times,
                                  rigged_for_the_copier, window=window))
    return {u: p for u, p in got.payloads.items() if u not in rejections}, rejections


def run_windows(s3, hp, dataset, commit_reveal: bool, windows: int) -> Outcome:
    hp.commit_reveal = commit_reveal
    creds = {u: s3.provision(f"auth{int(commit_reveal)}-{u}") for u in HONEST}
    net = MiniNet(hp, dataset, {u: "honest" for u in HONEST})
    state = ValidatorState.new(hp.digest(), secret=SECRET)
    out = Outcome({u: [] for u in (*HONEST, COPIER)})
    author = parse_commitment(creds[AUTHOR].commitment())
    assert isinstance(author, BucketInfo)
    for window in range(windows):
        placeholder = window % 2 == 0
        with CopyingS3(author, AUTHOR, COPIER, wallet_of(COPIER), net.codec, Expect.from_hparams(hp, window),
                       placeholder=placeholder) as copier:
            accepted, rejections = one_window(s3, hp, net, creds, copier, window, commit_reveal)
        for uid in out.verdicts:
            out.verdicts[uid].append(rejections[uid].reason.value if uid in rejections else "kept")
        evidence = WindowEvidence(window, accepted, rejections, list(out.verdicts), chain_randomness(window),
                                  eval_seed(window))
        report = score_window(state, Scorer(net.model, net.codec, net.dataset, hp), evidence)
        net.apply_aggregate(window, state.top_g, accepted)
        out.weights = dict(report.weights)
    return out


@pytest.mark.parametrize("commit_reveal", [False, True], ids=["plain", "commit-reveal"])
def test_a_copier_pinning_the_authors_headers_gets_nothing_and_the_author_keeps_its_pay(s3, hp, dataset,
                                                                                       commit_reveal):
    windows = 6 if not commit_reveal else 4
    got = run_windows(s3, hp, dataset, commit_reveal, windows)
    assert got.verdicts[AUTHOR] == ["kept"] * windows, got.verdicts
    copier = got.verdicts[COPIER]
    if commit_reveal:  # a placeholder commitment changed after the look; without one it was absent then
        assert copier == ["changed" if w % 2 == 0 else "no_commit" for w in range(windows)], got.verdicts
    else:              # its signature was first seen after the author's: the copy, whatever the tie-break says
        assert copier == ["duplicate"] * windows, got.verdicts
    assert all(v == ["kept"] * windows for u, v in got.verdicts.items() if u in OTHERS), got.verdicts
    assert got.weights.get(AUTHOR, 0.0) > 0.0 and got.weights.get(COPIER, 0.0) == 0.0, got.weights
