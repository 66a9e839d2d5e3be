"""Validators a node refused to follow stay refused across a restart, by the hotkey they had then."""
from __future__ import annotations

import json
import logging

from neurons import distrust


def test_a_refusal_holds_after_a_restart_only_for_the_same_hotkey(tmp_path):
    hotkeys = {0: "5Liar", 1: "5Honest", 2: "5Other"}
    distrust.save(tmp_path, {0, 2, 7}, hotkeys)  # uid 7 has left the chain: nothing to remember it by
    assert json.loads((tmp_path / distrust.FILE).read_text()) == {"refused": {"0": "5Liar", "2": "5Other"}}
    assert distrust.load(tmp_path, hotkeys) == {0, 2}
    # uid 2 was pruned and registered again by someone else: that newcomer starts trusted
    assert distrust.load(tmp_path, {0: "5Liar", 1: "5Honest", 2: "5Newcomer"}) == {0}
    assert distrust.load(tmp_path / "absent", hotkeys) == set()


def test_a_damaged_file_trusts_everyone_and_says_why(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    hotkeys = {0: "5Liar", 1: "5Honest"}
    path = tmp_path / distrust.FILE
    for text, words in (('{"refused": {"0": "5Li', "damaged"), ('{"refused": ["0"]}', "no 'refused' object"),
                        ("[1, 2]", "top level")):
        path.write_text(text)
        caplog.clear()
        assert distrust.load(tmp_path, hotkeys) == set()
        assert any(words in r.getMessage() for r in caplog.records), (text, caplog.text)
    path.write_text(json.dumps({"refused": {"0": 5, "x": "5Liar", "-1": "5Liar", "1": "5Honest"}}))
    assert distrust.load(tmp_path, hotkeys) == {1}  # only the well-formed entry whose hotkey matches


def test_a_failed_write_is_logged_not_raised(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    distrust.save(blocked, {0}, {0: "5Liar"})
    assert "could not save" in caplog.text
