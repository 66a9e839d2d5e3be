"""Signed uploads for tests: deterministic miner wallets and what an honest miner publishes."""
from __future__ import annotations

from dso.chain.wallets import dev_wallet, hotkey_address
from dso.protocol import signatures
from storage import keys, signature


def wallet_of(uid: int):
    """A deterministic development wallet per uid (the tests' miners)."""
    return dev_wallet(f"//tests/miner/{uid}")


def hotkeys_of(uids) -> dict[int, str]:
    return {uid: hotkey_address(wallet_of(uid)) for uid in uids}


def put_signed(client, bucket: str, hp, uid: int, window: int, data: bytes, run: str = "", wallet=None) -> str:
    """What an honest miner publishes: its signature object, then the payload (no lead: tests time it themselves).
    Returns the signature."""
    sig = signatures.sign_payload(wallet or wallet_of(uid), run, window, uid, data)
    signature.put(client, bucket, run, window, uid, hp.protocol_version, signatures.digest(data), sig)
    client.put(bucket, keys.gradient(window, uid, hp.protocol_version, run), data)
    return sig
