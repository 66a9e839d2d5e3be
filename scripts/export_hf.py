#!/usr/bin/env python
"""Export a DSO model to a folder Hugging Face ``transformers`` loads (Llama architecture).

    python scripts/export_hf.py CHECKPOINT OUT_DIR [the run's flags: --config FILE, --hparams.model.*,
                                                    --hparams.tokenizer, --data.corpus, --data.cache_dir …]

CHECKPOINT is one of:
  * a checkpoint in one file (storage/checkpoint_file.py): its metadata, parameter set, shapes and model
    hash are verified;
  * a validator state: its ``model.safetensors``, a ``w{window}/`` folder holding it, or the state
    folder itself (the one with ``current``); ``meta.json`` beside it, when present, must match.

The model shape and the tokeniser come from the same flags (or ``--config`` file) the run used: a
preset or ``--hparams.model.*`` keys, and ``--hparams.tokenizer`` with ``--data.corpus`` (a shard
folder carries its tokeniser; for a text corpus the cached or re-trained BPE is used) or
``--data.tokenizer_file``.  A checkpoint file names its data hash, whose first 16 digits are the
tokeniser's: an export with another tokeniser is refused.  OUT_DIR gets config.json,
generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json and
dso_provenance.json.  See docs/export.md for loading and sampling it.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import safetensors  # noqa: E402
import safetensors.torch  # noqa: E402
import torch  # noqa: E402

from dso.config.schema import Config  # noqa: E402
from dso.config.sources import build_parser, parse_args  # noqa: E402
from dso.data.corpus import DataError, corpus_files  # noqa: E402
from dso.data.dataset import resolve_tokenizer  # noqa: E402
from dso.data.shards import is_shard_corpus, open_shards  # noqa: E402
from dso.data.tokenizer import Tokenizer, TokenizerSpec  # noqa: E402
from dso.nn.hf_export import write_export  # noqa: E402
from dso.nn.model import Decoder, parameter_shapes, state_hash  # noqa: E402
from dso.protocol.rejections import Rejection  # noqa: E402
from storage.checkpoint_file import FORMAT, decode_checkpoint  # noqa: E402


class ExportError(RuntimeError):
    pass


def model_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):  # shapes only: no memory for a large preset
        return parameter_shapes(Decoder(cfg.hparams.model))


def resolve_source(path: Path) -> Path:
    """The safetensors file a CHECKPOINT argument names."""
    if path.is_dir():
        if (path / "current").is_file():
            path = path / (path / "current").read_text().strip()
        path = path / "model.safetensors"
    if not path.is_file():
        raise ExportError(f"{path}: no such checkpoint file")
    return path


def load_tensors(path: Path, cfg: Config) -> tuple[dict[str, torch.Tensor], dict]:
    """Verified parameters and provenance of a checkpoint file or a validator state's model file."""
    data = path.read_bytes()
    shapes = model_shapes(cfg)
    try:
        with safetensors.safe_open(str(path), "pt") as fh:
            metadata = fh.metadata() or {}
    except Exception as e:  # noqa: BLE001 — safetensors raises its own error types
        raise ExportError(f"{path}: not a safetensors file ({e})") from None
    if metadata.get("format") == FORMAT:
        ckpt = decode_checkpoint(data, shapes, cfg.hparams.protocol_version)
        if isinstance(ckpt, Rejection):
            raise ExportError(f"{path}: checkpoint refused ({ckpt}); do the model flags match the run's?")
        if ckpt.hparams_digest != cfg.hparams.digest():
            print(f"export_hf: note: the checkpoint's run settings digest {ckpt.hparams_digest} differs from these "
                  f"flags' {cfg.hparams.digest()} (the shapes match; check the tokeniser flags)", file=sys.stderr)
        return ckpt.tensors, {"window": ckpt.window, "model_hash": ckpt.model_hash, "data_hash": ckpt.data_hash,
                              "hparams_digest": ckpt.hparams_digest}
    try:  # safetensors runs no code; a damaged or foreign file is refused with one line, not a traceback
        tensors = safetensors.torch.load(data)
    except (safetensors.SafetensorError, ValueError, RuntimeError, OverflowError) as e:
        raise ExportError(f"{path}: not a readable safetensors file ({e})") from None
    if set(tensors) != set(shapes):
        extra, missing = sorted(set(tensors) - set(shapes)), sorted(set(shapes) - set(tensors))
        raise ExportError(f"{path}: parameters differ from the model the flags describe (unexpected "
                          f"{extra[:3]}, missing {missing[:3]})")
    for name, shape in shapes.items():
        if tuple(tensors[name].shape) != shape:
            raise ExportError(f"{path}: {name} has shape {tuple(tensors[name].shape)}, the flags give {shape}")
    ordered = {name: tensors[name].to(torch.float32) for name in shapes}
    digest = state_hash(ordered.items())
    meta = _read_meta(path.parent / "meta.json")
    if meta and meta.get("model_hash") not in (None, digest):
        raise ExportError(f"{path}: content hash {digest[:16]}… differs from meta.json's "
                          f"{str(meta['model_hash'])[:16]}…")
    return ordered, {"window": meta.get("model_window") if meta else None, "model_hash": digest}


def _read_meta(path: Path) -> dict:
    import json
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


def run_tokenizer(cfg: Config) -> Tokenizer:
    spec = TokenizerSpec.from_config(cfg)
    if spec.kind == "bytes":
        return Tokenizer.bytes()
    if spec.file:
        return spec.check(Tokenizer.from_file(spec.file), spec.file)
    if is_shard_corpus(cfg.data.corpus):
        return spec.check(open_shards(cfg.data.corpus, verify=False).tokenizer, cfg.data.corpus)
    return resolve_tokenizer(spec, corpus_files(cfg.data.corpus), Path(cfg.data.cache_dir).expanduser())


def export(checkpoint: str, out_dir: str, cfg: Config) -> Path:
    source = resolve_source(Path(checkpoint).expanduser())
    tensors, provenance = load_tensors(source, cfg)
    tok = run_tokenizer(cfg)
    data_hash = provenance.get("data_hash") or ""
    if data_hash and data_hash[:16] != tok.hash[:16]:
        raise ExportError(f"{source}: trained with tokeniser {data_hash[:16]}…, but these flags give "
                          f"{tok.describe()}: pass the run's --hparams.tokenizer / --data.corpus / tokenizer file")
    provenance.update({"source": str(source), "tokenizer": tok.describe(), "tokenizer_hash": tok.hash})
    return write_export(out_dir, tensors, cfg.hparams.model, tok, provenance)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="checkpoint file, validator model.safetensors, or state folder")
    parser.add_argument("out_dir", help="folder to write the transformers export to")
    cfg, ns = parse_args(argv, parser=parser)
    try:
        out = export(ns.checkpoint, ns.out_dir, cfg)
    except (ExportError, DataError) as e:
        print(f"export_hf: error: {e}", file=sys.stderr)
        return 2
    print(f"export_hf: wrote {out} — load it with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
