"""The Hugging Face export loads in `transformers` and computes what the project's model computes."""
import contextlib
import importlib.util
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dso.config.schema import ModelConfig
from dso.data.tokenizer import Tokenizer, train_bpe
from dso.nn.hf_export import interleaved_to_halves, write_export
from dso.nn.model import apply_rotary, build_model, rotary_tables
from repo import ROOT
from storage.checkpoint_file import encode_checkpoint

transformers = pytest.importorskip("transformers", reason="transformers is the export extra (make test installs it)")

FLAGS = ["--hparams.tokenizer", "bytes", "--hparams.model.vocab_size", "256", "--hparams.model.d_model", "64",
         "--hparams.model.n_layers", "2", "--hparams.model.n_heads", "4",
         "--hparams.model.ffn_hidden", "96", "--hparams.model.seq_len", "64", "--hparams.model.init_std", "0.3"]


def small_cfg(vocab: int = 256) -> ModelConfig:
    # a large init makes the logits far from uniform, so a wrong layout could not pass unnoticed
    return ModelConfig(vocab_size=vocab, d_model=64, n_layers=2, n_heads=4, ffn_hidden=96, seq_len=64, init_std=0.3)


def load(out: Path):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    return model, transformers.AutoTokenizer.from_pretrained(str(out), local_files_only=True)


@torch.no_grad()
def greedy(model, ids: torch.Tensor, steps: int) -> torch.Tensor:
    for _ in range(steps):
        ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=1)
    return ids


def test_rotary_permutation_turns_interleaved_pairs_into_halves():
    """HF's rotate-half rotary on permuted rows equals dso's interleaved rotary, up to that permutation."""
    head_dim, t = 8, 5
    x = torch.randn(1, 1, t, head_dim)
    cos, sin = rotary_tables(head_dim, t, 10000.0)
    ours = apply_rotary(x, cos, sin)
    perm = interleaved_to_halves(torch.arange(head_dim, dtype=torch.float32)[:, None], 1)[:, 0].long()
    xh, c2, s2 = x[..., perm], torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    rotate_half = torch.cat([-xh[..., head_dim // 2:], xh[..., :head_dim // 2]], -1)
    assert torch.allclose(xh * c2 + rotate_half * s2, ours[..., perm], atol=1e-6)


@pytest.mark.parametrize("kind", ["bytes", "bpe"])
def test_export_logits_match_and_generate_runs(tmp_path, stdlib_corpus, kind):
    tok = Tokenizer.bytes() if kind == "bytes" else train_bpe([stdlib_corpus.read_text()[:200_000]], 320)
    cfg = small_cfg(tok.vocab_size)
    ours = build_model(cfg, seed=5).eval()
    write_export(tmp_path, dict(ours.named_parameters()), cfg, tok)
    hf, hf_tok = load(tmp_path)
    text = "The quick brown fox, naïvely ☃, jumps."
    ids = hf_tok(text, return_tensors="pt")["input_ids"]
    assert ids[0].tolist() == tok.encode(text).tolist()        # same ids through AutoTokenizer
    with torch.no_grad():
        diff = (hf(ids).logits - ours(ids)).abs().max().item()
    assert diff <= 1e-4
    out = hf.generate(ids, max_new_tokens=6, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 6)
    assert torch.equal(out, greedy(ours, ids, 6))               # greedy decoding agrees token for token
    assert isinstance(hf_tok.decode(out[0]), str)


def _script():
    spec = importlib.util.spec_from_file_location("export_hf", ROOT / "scripts" / "export_hf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXPORT = _script()


def run_export(*args: str) -> SimpleNamespace:
    """scripts/export_hf.py's main in this process (a subprocess would pay torch's import each time)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = EXPORT.main(list(args))
    return SimpleNamespace(returncode=code, stderr=err.getvalue())


def test_export_script_from_a_checkpoint_file_and_a_validator_state(tmp_path):
    cfg = small_cfg()
    model = build_model(cfg, seed=9)
    from dso.data.tokenizer import Tokenizer as T
    data, model_hash = encode_checkpoint(model.named_parameters(), 7, 1, "digest", T.bytes().hash[:16] + "0" * 48)
    ckpt = tmp_path / "checkpoint-7.safetensors"
    ckpt.write_bytes(data)
    done = run_export(str(ckpt), str(tmp_path / "hf"), *FLAGS)
    assert done.returncode == 0, done.stderr
    provenance = json.loads((tmp_path / "hf" / "dso_provenance.json").read_text())
    assert provenance["window"] == 7 and provenance["model_hash"] == model_hash
    hf, _ = load(tmp_path / "hf")
    ids = torch.tensor([[1, 50, 200, 7]])
    with torch.no_grad():
        assert (hf(ids).logits - model(ids)).abs().max().item() <= 1e-4

    # a validator state folder (``current`` → w7/model.safetensors), as neurons/validator_state.py saves it
    import safetensors.torch
    state = tmp_path / "state"
    (state / "w7").mkdir(parents=True)
    safetensors.torch.save_file({n: p.detach() for n, p in model.named_parameters()},
                                str(state / "w7" / "model.safetensors"))
    (state / "current").write_text("w7")
    (state / "w7" / "meta.json").write_text(json.dumps({"model_window": 7, "model_hash": model_hash}))
    assert run_export(str(state), str(tmp_path / "hf2"), *FLAGS).returncode == 0
    assert (tmp_path / "hf2" / "model.safetensors").read_bytes() == (tmp_path / "hf" / "model.safetensors").read_bytes()

    other = run_export(str(ckpt), str(tmp_path / "hf4"), *FLAGS, "--hparams.model.ffn_hidden", "128")
    assert other.returncode == 2 and "checkpoint refused" in other.stderr
    bpe = run_export(str(ckpt), str(tmp_path / "hf5"), *FLAGS, "--hparams.tokenizer", "bpe",
                     "--hparams.model.vocab_size", "300")
    assert bpe.returncode == 2 and "checkpoint refused" in bpe.stderr


def test_export_refuses_a_tokeniser_the_checkpoint_was_not_trained_with(tmp_path, stdlib_corpus):
    tok = train_bpe([stdlib_corpus.read_text()[:200_000]], 300)
    tok.save(tmp_path / "tokenizer.json")
    model = build_model(small_cfg(300), seed=1)
    flags = [*FLAGS, "--hparams.tokenizer", "bpe", "--hparams.model.vocab_size", "300",
             "--data.tokenizer_file", str(tmp_path / "tokenizer.json")]
    for data_hash, ok in [(tok.hash[:16] + "0" * 48, True), ("f" * 64, False)]:
        data, _ = encode_checkpoint(model.named_parameters(), 3, 1, "digest", data_hash)
        (tmp_path / "c.safetensors").write_bytes(data)
        done = run_export(str(tmp_path / "c.safetensors"), str(tmp_path / f"hf-{ok}"), *flags)
        assert (done.returncode == 0) == ok, done.stderr
        assert ok or "trained with tokeniser ffffffffffffffff" in done.stderr
