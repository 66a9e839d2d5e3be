"""Payload signatures: a miner's hotkey signs (run, window, uid, sha256 of the payload bytes) with sr25519.

Anyone holding a payload and the uid's hotkey (from the chain's metagraph) can check that the miner behind
that uid published exactly these bytes for this window of this run.  Validators check it on every payload
they gather; every node checks it on every payload of a bundle before applying it, so a leader cannot
slip in bytes no miner signed (docs/protocol.md, "A leader nobody has to trust").

The signature is made before the payload is uploaded and published first (storage/signature.py): it binds
the digest, so the first time a validator sees it is evidence of when the miner held those bytes, which a
copier that needs the bytes to sign its copy cannot produce earlier (docs/decisions/0301).

Signing and verification are the SDK's (``dso.chain.wallets.sign`` / ``verify``); the message is
unambiguous: a fixed domain, then canonical JSON of the four fields.
"""
from __future__ import annotations

import hashlib
from typing import Any

from dso.chain.rules import canonical_json
from dso.chain.wallets import sign, verify

DOMAIN = b"dso-payload-signature/v1:"
SIGNATURE_HEX_CHARS = 128  # sr25519: 64 bytes
_HEX = frozenset("0123456789abcdef")


def digest(data: bytes) -> str:
    """sha256 of the payload bytes, lowercase hex: what the signature covers."""
    return hashlib.sha256(bytes(data)).hexdigest()


def message(run: str, window: int, uid: int, sha256: str) -> bytes:
    """The exact bytes a miner signs for its payload of ``window``."""
    return DOMAIN + canonical_json({"run": run, "window": int(window), "uid": int(uid), "sha256": sha256})


def sign_payload(wallet: Any, run: str, window: int, uid: int, data: bytes) -> str:
    """Hex signature of our payload bytes by the wallet's hotkey (WalletError when the wallet cannot sign)."""
    return sign(wallet, message(run, window, uid, digest(data)))


def is_signature(text: object) -> bool:
    return isinstance(text, str) and len(text) == SIGNATURE_HEX_CHARS and set(text) <= _HEX


def signature_problem(hotkey: str | None, run: str, window: int, uid: int, sha256: str, signature: str) -> str | None:
    """Why ``signature`` is not ``hotkey``'s signature of that payload digest (None: it is).  Never raises."""
    if not hotkey:
        return f"uid {uid} has no hotkey on chain"
    if not is_signature(signature):
        return f"not a {SIGNATURE_HEX_CHARS}-hex-digit signature"
    if not verify(hotkey, message(run, window, uid, sha256), signature):
        return f"not signed by uid {uid}'s hotkey {hotkey[:10]}… for window {window} (sha256 {sha256[:12]}…)"
    return None
