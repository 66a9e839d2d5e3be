import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest

from dso.config.schema import ConfigError
from dso.config.sources import from_dict
from dso.data.dataset import DataError, Dataset
from dso.data.tokenizer import Tokenizer, TokenizerSpec, bytes_as_hf, canonical_hash, train_bpe

SAMPLE = "Héllo, wörld!\n\tline two ☃ 🤗 \x01 end"
TRAIN_SNIPPET = """
import hashlib, sys
from pathlib import Path
from dso.data.tokenizer import train_bpe
tok = train_bpe([Path(sys.argv[1]).read_text()], 400)
print(hashlib.sha256(tok.to_json().encode()).hexdigest())
"""


@pytest.fixture(scope="module")
def bpe(stdlib_corpus):
    return train_bpe([stdlib_corpus.read_text()], 400)


def test_byte_tokeniser_is_the_utf8_bytes_and_its_hf_form_agrees():
    tok = Tokenizer.bytes()
    ids = tok.encode(SAMPLE)
    assert ids.tolist() == list(SAMPLE.encode()) and tok.decode(ids) == SAMPLE
    hf = bytes_as_hf()  # what an export ships: the same ids through the `tokenizers` library
    assert hf.encode(SAMPLE).ids == list(SAMPLE.encode()) and hf.decode(hf.encode(SAMPLE).ids) == SAMPLE
    assert tok.vocab_size == 256 and tok.token_bytes.sum() == 256


def test_bpe_training_is_byte_identical_in_another_process(bpe, stdlib_corpus):
    """Two nodes train the same tokenizer.json from the same text (another process: other hash seeds)."""
    out = subprocess.run([sys.executable, "-c", TRAIN_SNIPPET, str(stdlib_corpus)], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == hashlib.sha256(bpe.to_json().encode()).hexdigest()
    assert bpe.vocab_size == 400


def test_bpe_token_bytes_are_exact_and_text_round_trips(bpe, stdlib_corpus):
    text = stdlib_corpus.read_text()[:50_000] + SAMPLE
    ids = bpe.encode_long(text)
    assert bpe.token_bytes[ids].sum() == len(text.encode())     # the bits-per-byte denominator is exact
    assert bpe.decode(ids) == text
    assert len(ids) < 0.6 * len(text.encode())                   # merges did compress


def test_hash_ignores_serialisation_but_not_content(bpe):
    obj = json.loads(bpe.to_json())
    obj["version"] = "9.9"                                        # another library version's framing …
    obj["model"]["merges"] = [" ".join(m) for m in obj["model"]["merges"]]  # … and its older merge format
    assert canonical_hash(json.dumps(obj, indent=4, sort_keys=True)) == bpe.hash
    vocab = obj["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[:2]
    vocab[a], vocab[b] = vocab[b], vocab[a]                       # two ids swapped: another tokeniser
    assert canonical_hash(json.dumps(obj)) != bpe.hash


def test_non_byte_level_and_broken_files_are_refused_naming_the_file(tmp_path):
    from tokenizers import Tokenizer as HF
    from tokenizers import models, pre_tokenizers
    word = HF(models.WordLevel({"hello": 0, "world": 1, "[UNK]": 2}, unk_token="[UNK]"))
    word.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "word.json").write_text(word.to_str())
    with pytest.raises(DataError, match="not byte-level"):
        Tokenizer.from_file(tmp_path / "word.json")
    (tmp_path / "junk.json").write_text("{nope")
    with pytest.raises(DataError, match="junk.json: not a tokenizers JSON"):
        Tokenizer.from_file(tmp_path / "junk.json")


def test_corpus_too_small_for_the_vocabulary():
    with pytest.raises(DataError, match="too small to learn a 5000-token BPE"):
        train_bpe(["ab ab ab cd cd"], 5000)


@pytest.mark.parametrize("data, message", [
    ({"hparams": {"tokenizer": "bytes", "model": {"vocab_size": 512}}}, "the byte tokeniser has 256 ids"),
    ({"hparams": {"tokenizer": "bpe", "model": {"vocab_size": 256}}}, "a BPE needs more than the 256 byte ids"),
    ({"hparams": {"tokenizer": "bytes", "model": {"vocab_size": 256}}, "data": {"tokenizer_file": "t.json"}},
     "only used with hparams.tokenizer=bpe"),
    ({"hparams": {"tokenizer": "wordpiece"}}, "must be one of bytes, bpe"),
])
def test_config_keeps_tokeniser_and_vocabulary_in_agreement(data, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(data)
    assert from_dict({"hparams": {"tokenizer": "bpe", "model": {"vocab_size": 1024}}}).hparams.tokenizer == "bpe"


def test_dataset_with_bpe_is_cached_and_a_node_with_another_tokeniser_refuses(stdlib_corpus, tmp_path, bpe):
    spec = TokenizerSpec("bpe", 400)
    a = Dataset.from_config(str(stdlib_corpus), str(tmp_path), 32, 7, 0.05, tokenizer=spec)
    assert a.tokenizer.to_json() == bpe.to_json()                 # trained from the corpus on first use
    assert len(list(tmp_path.glob("tokenizer-*.json"))) == 1
    b = Dataset.from_config(str(stdlib_corpus), str(tmp_path), 32, 7, 0.05, expected_hash=a.data_hash, tokenizer=spec)
    batch = b.assigned(0, 0, 4)
    assert batch.max() < 400 and b.target_bytes(batch) == sum(len(b.tokenizer.decode(r[1:]).encode()) for r in batch)
    with pytest.raises(DataError, match="tokeniser .*bytes.* is not the run's"):
        Dataset.from_config(str(stdlib_corpus), str(tmp_path), 32, 7, 0.05, expected_hash=a.data_hash)
    file = tmp_path / "mine.json"
    train_bpe([stdlib_corpus.read_text()[:200_000]], 400).save(file)  # another BPE of the same size
    other = TokenizerSpec("bpe", 400, str(file))
    with pytest.raises(DataError, match="is not the run's"):
        Dataset.from_config(str(stdlib_corpus), str(tmp_path), 32, 7, 0.05, expected_hash=a.data_hash, tokenizer=other)
    with pytest.raises(DataError, match="has 400 token ids but hparams.model.vocab_size is 512"):
        Dataset.from_config(str(stdlib_corpus), str(tmp_path), 32, 7, 0.05,
                            tokenizer=TokenizerSpec("bpe", 512, str(file)))


def test_encode_long_cuts_at_lines_the_same_way_every_time(bpe, stdlib_corpus):
    text = stdlib_corpus.read_text()[:300_000]
    first, second = bpe.encode_long(text), bpe.encode_long(text)
    assert np.array_equal(first, second) and bpe.decode(first) == text
