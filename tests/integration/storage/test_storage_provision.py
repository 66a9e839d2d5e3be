"""Keys without IAM: SeaweedFS identity files, the `provision` refusals, and `check` for keys made elsewhere."""
from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from repo import ROOT
from storage.credentials import AdminCredentials, PeerCredentials
from storage.seaweedfs import IdentityFile, merge_identities, peer_identities
from storage.server import main as server_main


def test_peer_identities_scope_every_action_to_the_own_bucket():
    write, read = peer_identities("alice", "dso-alice", ("W", "ws"), ("R", "rs"))
    assert write["actions"] == ["Read:dso-alice", "Write:dso-alice", "List:dso-alice", "Tagging:dso-alice"]
    assert read["actions"] == ["Read:dso-alice", "List:dso-alice"]  # no Write: it is published
    assert read["credentials"] == [{"accessKey": "R", "secretKey": "rs"}]


def test_merging_replaces_an_identity_of_the_same_name_and_keeps_the_others():
    config = {"identities": [{"name": "dso-admin"}, {"name": "dso-a-read", "credentials": ["old"]}],
              "accounts": [1]}
    merged = merge_identities(config, [{"name": "dso-a-read", "credentials": ["new"]}])
    assert merged["identities"] == [{"name": "dso-admin"}, {"name": "dso-a-read", "credentials": ["new"]}]
    assert merged["accounts"] == [1]


def test_identity_file_is_private_and_refuses_garbage(tmp_path):
    f = IdentityFile(tmp_path / "s3.json")
    creds = f.add_peer("bob", "http://127.0.0.1:1")
    assert oct((tmp_path / "s3.json").stat().st_mode & 0o777) == "0o600"
    names = [i["name"] for i in f.load()["identities"]]
    assert names == ["dso-bob-write", "dso-bob-read"] and creds.bucket == "dso-bob"
    assert creds.write_key_id != creds.read_key_id
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="identities"):
        IdentityFile(tmp_path / "bad.json").load()
    with pytest.raises(ValueError, match="peer name"):
        f.add_peer("Bad_Name", "http://127.0.0.1:1")


def test_provision_without_iam_is_one_line_saying_what_to_do(seaweedfs_engine, tmp_path):
    """SeaweedFS refuses IAM writes by default: the command must say so in one line, no traceback."""
    admin_file = tmp_path / "admin.json"
    seaweedfs_engine.admin.save(admin_file)
    out = subprocess.run([sys.executable, "-m", "storage.server", "provision", "nobody", "--admin-file",
                          str(admin_file)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "refused the IAM API" in lines[0] and "--seaweedfs-config" in lines[0] and "dso-nobody" in lines[0]


def test_provision_refusals_are_one_line(tmp_path, capsys):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    admin_file = tmp_path / "admin.json"
    AdminCredentials(f"http://127.0.0.1:{port}", "us-east-1", "AKIAX", "s" * 40).save(admin_file)
    cases = [["provision", "x", "--admin-file", str(admin_file)],
             ["provision", "x", "--admin-file", str(tmp_path / "absent.json")],
             ["provision", "x", "--seaweedfs-config", str(tmp_path / "s3.json")],          # no --endpoint
             ["check", str(tmp_path / "absent.json")]]
    for argv in cases:
        assert server_main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("python -m storage.server "), (argv, err)


def test_seaweedfs_config_path_then_check_passes(seaweedfs_engine, tmp_path, capsys):
    """What an operator of their own SeaweedFS does: add identities to its file, reload, create the bucket."""
    engine = seaweedfs_engine
    out_file = tmp_path / "frank.json"
    assert server_main(["provision", "frank", "--seaweedfs-config", str(engine.identities.path),
                        "--endpoint", engine.endpoint, "--out", str(out_file)]) == 0
    printed = json.loads(capsys.readouterr().out)
    creds = PeerCredentials.load(out_file)
    assert printed["commitment"] == creds.commitment() and creds.bucket == "dso-frank"
    engine.admin.client().ensure_bucket(creds.bucket)
    engine.reload()
    engine._wait_for_key(creds, timeout=20)
    assert server_main(["check", str(out_file)]) == 0
    assert capsys.readouterr().out.strip().endswith("keys ok")


def test_check_catches_a_read_key_that_can_write(s3, tmp_path, capsys):
    good = s3.provision("grace")
    good.save(tmp_path / "good.json")
    assert server_main(["check", str(tmp_path / "good.json")]) == 0
    capsys.readouterr()
    leaky = PeerCredentials(**{**good.__dict__, "read_key_id": good.write_key_id, "read_secret": good.write_secret})
    leaky.save(tmp_path / "leaky.json")
    assert server_main(["check", str(tmp_path / "leaky.json")]) == 1
    out = capsys.readouterr().out
    assert "FAIL read key PUT: allowed" in out and "FAIL read key DELETE: allowed" in out
