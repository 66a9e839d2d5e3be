"""What a miner submits for a window, once read and checked: the seam between transport and scoring.

``storage/wire.py`` turns bytes into a :class:`Payload` (or a rejection); ``scoring/`` and the window engine read
payloads and never bytes.  Both import this module; neither imports the other.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dso.codec.codecs import Update


@dataclass(frozen=True)
class PayloadMeta:
    uid: int
    window: int
    protocol_version: int
    hparams_digest: str
    data_hash: str = ""
    model_hash: str = ""
    # sequences of its window's assignment the miner trained on, from the first (it declares them; the proof of
    # computation samples its test sequences from exactly these, so a claim of more than it trained fails the
    # test, and the pay counts them as the miner's work: docs/scoring.md, "Proof of computation")
    trained: int = 0


@dataclass
class Payload:
    meta: PayloadMeta
    update: Update                 # the codec's CompressedUpdate
    sync_values: torch.Tensor      # float32 (sync_samples,)
    nbytes: int
    last_modified: float | None = None  # the peer's server's time (untrusted), set by gather
    seen: float | None = None           # when the validator itself first saw its signature (storage/look.py)
    sha256: str = ""                    # of the bytes read (dso/protocol/signatures.py digest), set by gather
    signature: str = ""                 # the miner's signature of those bytes, set by a gather that checks it
    evidence: str = ""                  # sha256 of the signature object as read: what the look compares
    raw: bytes = field(default=b"", repr=False)  # the bytes read: a bundle carries them as signed
