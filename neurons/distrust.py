"""Validators this node refused to follow, remembered across restarts.

A node that refused a validator's bundle (a payload its miner did not sign, or one this validator rejected)
skips that validator as a source of bundles and checkpoints (``PeerDirectory.distrusted``).  Each refusal is
saved in the node's state folder with the hotkey the uid had then, so a restarted node does not follow a liar
again; a uid registered since by another hotkey starts trusted.  Deleting the file trusts them all again.
The file is the node's own; a damaged one is logged and read as empty, never fatal.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from neurons.persist import load_json, save_json

log = logging.getLogger("dso.follow")
FILE = "distrusted.json"


def load(state_dir: Path, hotkeys: Mapping[int, str]) -> set[int]:
    """The uids refused before whose hotkey on chain (``hotkeys``: uid → hotkey) is still the one refused."""
    saved = load_json(Path(state_dir) / FILE)
    refused = saved.get("refused") if saved is not None else None
    if not isinstance(refused, dict):
        if saved is not None:
            log.warning("%s has no 'refused' object: trusting every validator", Path(state_dir) / FILE)
        return set()
    out = {int(uid) for uid, hotkey in refused.items()
           if isinstance(uid, str) and uid.isdigit() and isinstance(hotkey, str) and hotkeys.get(int(uid)) == hotkey}
    if out:
        log.warning("not following validator uids %s, refused before this restart (%s)", sorted(out),
                    Path(state_dir) / FILE)
    return out


def save(state_dir: Path, distrusted: set[int], hotkeys: Mapping[int, str]) -> None:
    """Write the refused uids with their current hotkeys; a failed write is logged (the refusal still holds
    until the node restarts)."""
    refused = {str(uid): hotkeys[uid] for uid in sorted(distrusted) if uid in hotkeys}
    try:
        save_json(Path(state_dir) / FILE, {"refused": refused})
    except OSError as e:
        log.warning("could not save %s: %s", Path(state_dir) / FILE, e)
