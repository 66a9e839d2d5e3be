import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dso.data.dataset import DataError, Dataset, corpus_tokenizer
from dso.data.shard_writer import write_shards
from dso.data.shards import MANIFEST, ShardFile, open_shards
from dso.data.tokenizer import Tokenizer, TokenizerSpec, train_bpe
from repo import ROOT

RECORDS = [{"text": "first record"}, {"text": "second record\n", "id": 2}, {"text": "   "}]


@pytest.fixture
def folder(tmp_path, stdlib_corpus):
    src = tmp_path / "corpus"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_bytes(stdlib_corpus.read_bytes()[:60_000])
    (src / "sub" / "b.jsonl").write_text("\n".join(json.dumps(r) for r in RECORDS) + "\n\n")
    (src / "ignored.bin").write_bytes(b"\0\1\2")  # not a text suffix: not read
    return src


def expected_text(folder: Path) -> str:
    return (folder / "a.txt").read_text() + "first record\nsecond record\n"


@pytest.mark.parametrize("kind", ["bytes", "bpe"])
def test_shards_hold_the_corpus_tokens_in_order(folder, tmp_path, kind):
    tok = Tokenizer.bytes() if kind == "bytes" else train_bpe([expected_text(folder)], 300)
    manifest = write_shards(sorted([folder / "a.txt", folder / "sub" / "b.jsonl"]), tok, tmp_path / "out",
                            shard_tokens=7_000)
    shards = open_shards(tmp_path / "out")
    ids = np.concatenate([np.asarray(a) for a in shards.arrays])
    assert shards.tokenizer.hash == tok.hash and manifest.documents == 3 and manifest.tokens == ids.size
    assert all(isinstance(a, ShardFile) for a in shards.arrays) and len(shards.arrays) == -(-ids.size // 7_000)
    assert shards.arrays[0].dtype == np.uint16
    assert tok.decode(ids) == expected_text(folder)


def test_dataset_on_shards_cuts_sequences_within_each_shard(folder, tmp_path):
    write_shards([folder / "a.txt"], Tokenizer.bytes(), tmp_path / "out", shard_tokens=1000)
    ds = Dataset.from_config(str(tmp_path / "out"), str(tmp_path / "cache"), 32, 7, 0.05)
    raw = np.frombuffer((folder / "a.txt").read_bytes(), np.uint8)
    per_shard = 1000 // 33
    assert ds.n_sequences == (raw.size // 1000) * per_shard + (raw.size % 1000) // 33
    row = per_shard + 2                                   # the third sequence of the second shard
    assert np.array_equal(ds.sequences[row], raw[1000 + 2 * 33: 1000 + 3 * 33])
    assert corpus_tokenizer(str(tmp_path / "out")) == TokenizerSpec("bytes", 256)
    assert corpus_tokenizer(str(folder)) is None
    same = Dataset.from_config(str(tmp_path / "out" / MANIFEST), str(tmp_path / "cache"), 32, 7, 0.05)
    assert same.data_hash == ds.data_hash
    with pytest.raises(DataError, match="uses the bytes tokeniser but the run asks for hparams.tokenizer=bpe"):
        Dataset.from_config(str(tmp_path / "out"), str(tmp_path / "cache"), 32, 7, 0.05,
                            tokenizer=TokenizerSpec("bpe", 300))


def test_text_corpus_and_its_shards_give_the_same_data_hash(folder, tmp_path):
    """A folder used directly (shards built in the cache) and prepare_data's shards are the same data."""
    direct = Dataset.from_config(str(folder), str(tmp_path / "cache"), 16, 1, 0.05)
    write_shards(sorted([folder / "a.txt", folder / "sub" / "b.jsonl"]), Tokenizer.bytes(), tmp_path / "out")
    assert Dataset.from_config(str(tmp_path / "out"), str(tmp_path / "c2"), 16, 1, 0.05).data_hash == direct.data_hash


@pytest.mark.parametrize("name, content, message", [
    ("empty.txt", b"", "empty.txt: empty file"),
    ("blank.txt", b"  \n\n\t", "blank.txt: empty file"),
    ("image.txt", b"GIF89a\x00\x01\x02", r"image.txt: binary file \(NUL byte at offset 6\)"),
    ("latin1.txt", "ok line\ncaf\xe9\n".encode("latin-1"), "latin1.txt: invalid UTF-8 at byte 11"),
    ("bad.jsonl", b'{"text": "fine"}\n{"text": 3}\n', "bad.jsonl:2: expected a JSON object with a string 'text'"),
    ("broken.jsonl", b'{"text": "fine"}\n{"text": \n', r"broken.jsonl:2: not valid JSON"),
    # json raises a plain ValueError (no .msg) for an integer past Python's 4300-digit limit
    ("huge.jsonl", b'{"text": "fine"}\n{"n": ' + b"1" * 5000 + b'}\n', r"huge.jsonl:2: not valid JSON \(Exceeds"),
    ("none.jsonl", b'\n{"text": ""}\n', "none.jsonl: empty file"),
])
def test_bad_input_is_refused_naming_the_file(tmp_path, name, content, message):
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.txt").write_text("some good text\n" * 10)
    (src / name).write_bytes(content)
    with pytest.raises(DataError, match=message):
        write_shards(sorted(src.iterdir()), Tokenizer.bytes(), tmp_path / "out")
    assert not (tmp_path / "out" / MANIFEST).exists()      # nothing half-written looks complete
    with pytest.raises(DataError, match=message):
        Dataset.from_config(str(src), str(tmp_path / "cache"), 8, 1, 0.1)


def test_a_changed_shard_or_manifest_is_refused(folder, tmp_path):
    out = tmp_path / "out"
    write_shards([folder / "a.txt"], Tokenizer.bytes(), out, shard_tokens=20_000)
    shard = out / "shard-00001.npy"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"shard-00001\.npy: sha256 .* differs from the manifest's"):
        open_shards(out)
    manifest = json.loads((out / MANIFEST).read_text())
    for field, value, message in [("file", "../a.npy", "shard entry 0 needs file"),
                                  ("tokens", -1, "shard entry 0 needs"),
                                  ("sha256", "x" * 64, "shard entry 0 needs")]:
        bad = json.loads(json.dumps(manifest))
        bad["shards"][0][field] = value
        (out / MANIFEST).write_text(json.dumps(bad))
        with pytest.raises(DataError, match=f"manifest.json: {message}"):
            open_shards(out)


def test_ids_outside_the_vocabulary_are_refused(tmp_path):
    from dso.data.shards import Manifest, ShardInfo, file_sha256
    out = tmp_path / "out"
    out.mkdir()
    np.save(out / "shard-00000.npy", np.array([1, 2, 300] * 10, np.uint16))
    info = ShardInfo("shard-00000.npy", file_sha256(out / "shard-00000.npy"), 30)
    tok = Tokenizer.bytes()
    (out / MANIFEST).write_text(Manifest("bytes", 256, tok.hash, "uint16", [info]).to_json())
    with pytest.raises(DataError, match="shard-00000.npy: holds token id 300, outside the vocabulary of 256"):
        open_shards(out)


def run_prepare(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "prepare_data.py"), *args],
                          capture_output=True, text=True, timeout=300)


def test_prepare_data_script_writes_shards_and_says_how_to_train(folder, tmp_path):
    out = tmp_path / "shards"
    done = run_prepare(str(folder), "--out", str(out), "--tokenizer", "bpe", "--vocab-size", "300")
    assert done.returncode == 0, done.stderr
    assert "tokenising: 100.0%" in done.stderr                   # plain progress lines off a terminal
    assert f"--data.corpus {out} --set hparams.tokenizer=bpe --set hparams.model.vocab_size=300" in done.stdout
    ds = Dataset.from_config(str(out), str(tmp_path / "cache"), 16, 1, 0.05, tokenizer=TokenizerSpec("bpe", 300))
    assert ds.tokenizer.vocab_size == 300 and (out / "tokenizer.json").is_file()
    again = run_prepare(str(folder), "--out", str(out), "--tokenizer", "bytes")
    assert again.returncode == 2 and "already holds a shard manifest" in again.stderr
    odd = run_prepare(str(folder), "--out", str(tmp_path / "odd"), "--tokenizer", "bytes", "--chunk-bytes", "1000")
    assert odd.returncode == 2 and "chunk size 1000: a multiple of 64" in odd.stderr
    (folder / "empty.md").write_text("")
    bad = run_prepare(str(folder), "--out", str(tmp_path / "other"), "--tokenizer", "bytes")
    assert bad.returncode == 2 and "empty.md: empty file" in bad.stderr


def test_chunk_digests_are_written_checked_and_in_the_data_hash(folder, tmp_path):
    """Each shard's .chunks file holds the sha256 of every chunk_bytes piece of the shard's file; the manifest
    holds its hash, opening checks it, and the data hash covers it (so a reader that checks chunk by chunk
    checks against the run's data hash)."""
    import hashlib

    from dso.data.shards import chunk_digests, data_hash, read_manifest
    out = tmp_path / "out"
    manifest = write_shards([folder / "a.txt"], Tokenizer.bytes(), out, shard_tokens=20_000, chunk_bytes=4096)
    raw = (out / "shard-00001.npy").read_bytes()
    digests = (out / "shard-00001.chunks").read_bytes()
    assert len(digests) == 32 * -(-len(raw) // 4096)
    assert digests[32:64] == hashlib.sha256(raw[4096:8192]).digest()
    assert digests == chunk_digests(raw, 4096)
    assert manifest.shards[1].chunks_sha256 == hashlib.sha256(digests).hexdigest()
    assert read_manifest(out) == manifest and manifest.chunk_bytes == 4096
    again = write_shards([folder / "a.txt"], Tokenizer.bytes(), tmp_path / "again", shard_tokens=20_000,
                         chunk_bytes=8192)
    assert data_hash(again) != data_hash(manifest)        # same tokens, other chunks: another manifest
    edited = json.loads((out / MANIFEST).read_text())
    edited["shards"][1]["chunks_sha256"] = "0" * 64
    (out / MANIFEST).write_text(json.dumps(edited))
    with pytest.raises(DataError, match=r"shard-00001\.npy: its chunk digests hash to .* the manifest says 0000"):
        open_shards(out)


def test_a_version_1_folder_still_opens_with_its_old_hash(folder, tmp_path):
    """Shard folders made before chunk digests existed open as before, with the data hash they always had."""
    import hashlib

    from dso.data.shards import Manifest, ShardInfo, data_hash, file_sha256
    out = tmp_path / "v1"
    write_shards([folder / "a.txt"], Tokenizer.bytes(), out, shard_tokens=30_000)
    v2 = open_shards(out).manifest
    v1 = Manifest("bytes", 256, v2.tokenizer_hash, "uint16",
                  [ShardInfo(s.file, file_sha256(out / s.file), s.tokens) for s in v2.shards])
    (out / MANIFEST).write_text(v1.to_json())
    assert json.loads((out / MANIFEST).read_text())["version"] == 1
    opened = open_shards(out)
    legacy = hashlib.sha256(f"dso-data-v2|{v2.tokenizer_hash}|uint16".encode())
    for s in v2.shards:
        legacy.update(f"|{s.sha256}:{s.tokens}".encode())
    assert opened.data_hash == v2.tokenizer_hash[:16] + legacy.hexdigest()[:48] == data_hash(v1)
    assert opened.data_hash != data_hash(v2)
