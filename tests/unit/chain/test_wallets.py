"""Wallets and signatures through the bittensor SDK: non-interactive creation, loading, sign/verify."""
from __future__ import annotations

import pytest

from dso.chain.wallets import (
    WalletError,
    create_local_wallet,
    dev_wallet,
    hotkey_address,
    is_valid_address,
    load_wallet,
    sign,
    verify,
)
from dso.config.schema import WalletConfig


def test_local_wallets_are_created_without_prompts_and_load_by_name(tmp_path):
    cfg = WalletConfig(name="miner", hotkey="h1", path=str(tmp_path))
    with pytest.raises(WalletError, match="python -m dso.chain wallet"):
        load_wallet(cfg)
    created = load_wallet(cfg, create=True)
    assert (tmp_path / "miner" / "hotkeys" / "h1").is_file()
    again = load_wallet(cfg)
    assert hotkey_address(again) == hotkey_address(created)
    other = create_local_wallet("miner", "h2", str(tmp_path))  # same coldkey, a second hotkey
    assert hotkey_address(other) != hotkey_address(created)
    assert other.coldkeypub.ss58_address == created.coldkeypub.ss58_address


def test_encrypted_hotkey_without_a_password_is_refused_up_front(tmp_path, monkeypatch):
    import bittensor as bt

    create_local_wallet("enc", "hot", str(tmp_path))
    wallet = bt.Wallet("enc", "hot", str(tmp_path))
    # an encrypted keyfile starts with the NaCl marker (no need to pay for a real key derivation here)
    (tmp_path / "enc" / "hotkeys" / "hot").write_bytes(b"$NACL" + bytes(64))
    monkeypatch.delenv(wallet.hotkey_file.env_var_name(), raising=False)
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    with pytest.raises(WalletError, match=wallet.hotkey_file.env_var_name()):
        load_wallet(WalletConfig("enc", "hot", str(tmp_path)))


def test_signatures_verify_only_for_the_signer_and_the_exact_bytes():
    alice, bob = dev_wallet("//Alice"), dev_wallet("//Bob")
    assert hotkey_address(alice) == "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY"  # the well-known dev key
    sig = sign(alice, b"payload")
    assert verify(hotkey_address(alice), b"payload", sig)
    assert not verify(hotkey_address(alice), b"payload!", sig)
    assert not verify(hotkey_address(bob), b"payload", sig)
    for bad_address, bad_sig in [("garbage", sig), (hotkey_address(alice), "zz"), (hotkey_address(alice), "ab")]:
        assert not verify(bad_address, b"payload", bad_sig)  # never raises on junk
    assert is_valid_address(hotkey_address(bob)) and not is_valid_address("5" * 48) and not is_valid_address(7)
