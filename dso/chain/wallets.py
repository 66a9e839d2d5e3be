"""Identities: Bittensor wallets and their hotkeys, and sr25519 signatures — all through the SDK.

The same ``--wallet.name / --wallet.hotkey / --wallet.path`` flags select a
wallet on the local and on the real chain.  Local networks and tests create
unencrypted wallets non-interactively (:func:`create_local_wallet`) or use
in-memory development keys (:func:`dev_wallet`, e.g. ``//Alice``).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import bittensor as bt
import bittensor_core

if TYPE_CHECKING:
    from dso.config.schema import WalletConfig

SR25519 = bittensor_core.CRYPTO_SR25519


class WalletError(RuntimeError):
    """A wallet cannot be loaded or used; the message says what to do."""


def _wallet_dir(path: str, name: str) -> Path:
    return Path(path).expanduser() / name


def load_wallet(cfg: WalletConfig, create: bool = False) -> bt.Wallet:
    """The wallet named by a :class:`dso.config.schema.WalletConfig` (name, hotkey, path).

    With ``create=True`` a missing wallet/hotkey is created unencrypted (local
    networks only).  The hotkey is unlocked here, at start-up, so a password
    prompt or a bad keyfile never surprises a long-running process later.
    """
    wallet = bt.Wallet(cfg.name, cfg.hotkey, str(Path(cfg.path).expanduser()))
    if not wallet.hotkey_file.exists_on_device():
        if not create:
            raise WalletError(
                f"no hotkey '{cfg.hotkey}' in wallet '{cfg.name}' under {cfg.path}: create it with "
                f"`python -m dso.chain wallet --wallet.name {cfg.name} --wallet.hotkey {cfg.hotkey}` "
                "(local) or `btcli wallet new_hotkey` (real chain)")
        return create_local_wallet(cfg.name, cfg.hotkey, cfg.path)
    if wallet.hotkey_file.is_encrypted() and not sys.stdin.isatty():
        env = wallet.hotkey_file.env_var_name()
        if not os.environ.get(env):
            raise WalletError(f"hotkey {wallet.hotkey_file.path} is encrypted; set {env} to its password")
    try:
        keypair = wallet.hotkey
    except Exception as e:  # keyfile errors come from the Rust core with varied types
        raise WalletError(f"cannot read hotkey {wallet.hotkey_file.path}: {e}") from None
    if keypair.crypto_type != SR25519:
        raise WalletError(f"hotkey {wallet.hotkey_file.path} is not sr25519")
    return wallet


def create_local_wallet(name: str, hotkey: str = "default", path: str = "~/.bittensor/wallets",
                        overwrite: bool = False) -> bt.Wallet:
    """Create (or complete) an unencrypted wallet without any prompt; returns it.

    An existing coldkey is kept; an existing hotkey is kept unless ``overwrite``.
    For local networks and tests only — real funds belong in an encrypted coldkey.
    """
    wallet = bt.Wallet(name, hotkey, str(Path(path).expanduser()))
    try:
        if not wallet.coldkeypub_file.exists_on_device():
            wallet.create_new_coldkey(use_password=False, overwrite=overwrite, suppress=True)
        if overwrite or not wallet.hotkey_file.exists_on_device():
            wallet.create_new_hotkey(use_password=False, overwrite=overwrite, suppress=True)
    except (OSError, ValueError) as e:
        raise WalletError(f"cannot create wallet {name}/{hotkey} under {path}: {e}") from None
    return wallet


@dataclass(frozen=True)
class DevWallet:
    """Wallet-shaped holder of development keypairs (no files), accepted wherever a wallet is."""

    hotkey: Any
    coldkey: Any

    @property
    def coldkeypub(self) -> Any:
        return self.coldkey

    @property
    def name(self) -> str:
        name: str = self.hotkey.ss58_address[:8]
        return name


def dev_wallet(uri: str) -> DevWallet:
    """A wallet whose hotkey derives from ``uri`` (``//Alice``, ``//miner/3``) and coldkey from ``uri//cold``."""
    try:
        hot = bittensor_core.Keypair.create_from_uri(uri)
        cold = bittensor_core.Keypair.create_from_uri(uri + "//cold")
    except Exception as e:
        raise WalletError(f"bad development key uri {uri!r}: {e}") from None
    return DevWallet(hotkey=hot, coldkey=cold)


# ----------------------------------------------------------------- keys
def hotkey_address(wallet: Any) -> str:
    """ss58 address of the wallet's hotkey."""
    try:
        return str(wallet.hotkey.ss58_address)
    except Exception as e:
        raise WalletError(f"wallet has no usable hotkey: {e}") from None


def is_valid_address(ss58: Any) -> bool:
    if not isinstance(ss58, str) or not 40 <= len(ss58) <= 60:
        return False
    try:
        bittensor_core.ss58_decode(ss58)
    except Exception:
        return False
    return True


def sign(wallet: Any, data: bytes) -> str:
    """Hex sr25519 signature of ``data`` by the wallet's hotkey."""
    try:
        return bytes(wallet.hotkey.sign(bytes(data))).hex()
    except Exception as e:
        raise WalletError(f"cannot sign with the wallet's hotkey: {e}") from None


def verify(ss58: str, data: bytes, signature: str) -> bool:
    """True iff ``signature`` (hex) is ``ss58``'s sr25519 signature of ``data``; never raises."""
    try:
        sig = bytes.fromhex(signature)
        return bool(bittensor_core.verify(bytes(data), sig, ss58, SR25519))
    except Exception:  # malformed address, hex or signature length: not a valid signature
        return False
