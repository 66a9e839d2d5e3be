"""Text from a trained model: load a checkpoint (safetensors only, never pickle) and sample.

``scripts/sample.py CHECKPOINT --prompt TEXT`` is the command; the local network's report uses
:func:`samples_from` on the validator's final model.  A checkpoint is a ``model.safetensors`` holding the
model's parameters by name (a validator's saved state also holds its outer state: extra keys are
ignored), or a folder: a validator state folder (its ``current`` pointer) or any folder holding
``w<window>/model.safetensors`` (the newest window wins).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import safetensors.torch
import torch

from dso.config.schema import HParams
from dso.nn.model import Decoder, build_model

if TYPE_CHECKING:
    from dso.config.schema import Config
    from dso.data.tokenizer import Tokenizer


class CheckpointError(ValueError):
    pass


def find_checkpoint(path: str | Path) -> Path:
    """The ``model.safetensors`` a path names (see the module docstring)."""
    path = Path(path)
    if path.is_file():
        return path
    pointer = path / "current"
    if pointer.is_file():
        candidate = path / pointer.read_text().strip() / "model.safetensors"
        if candidate.is_file():
            return candidate
    found = []
    for file in path.rglob("model.safetensors"):
        match = re.fullmatch(r"w(\d+)", file.parent.name)
        found.append((int(match.group(1)) if match else -1, str(file)))
    if not found:
        raise CheckpointError(f"{path}: no model.safetensors found")
    return Path(max(found)[1])


def load_model(path: str | Path, hp: HParams) -> Decoder:
    """The run's model with the checkpoint's parameters; every parameter must be present with its shape."""
    file = find_checkpoint(path)
    tensors = safetensors.torch.load_file(str(file))
    model = build_model(hp.model, hp.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            t = tensors.get(name)
            if t is None or tuple(t.shape) != tuple(p.shape):
                got = "missing" if t is None else f"of shape {tuple(t.shape)}"
                raise CheckpointError(f"{file}: parameter {name} {got}; this run's model needs {tuple(p.shape)}")
            if not bool(torch.isfinite(t).all()):
                raise CheckpointError(f"{file}: parameter {name} holds non-finite values")
            p.copy_(t.to(p.dtype))
    model.eval()
    return model


@torch.no_grad()
def generate(model: Decoder, ids: list[int], new_tokens: int, temperature: float = 0.0, seed: int = 0) -> list[int]:
    """``new_tokens`` ids after ``ids``: greedy (argmax) for ``temperature <= 0``, else sampled from
    softmax(logits / temperature) with a generator seeded by ``seed`` (the same seed, the same text).
    The context is the last ``seq_len`` ids."""
    if not ids:
        raise ValueError("generation needs at least one prompt token")
    gen = torch.Generator().manual_seed(seed)
    out = list(ids)
    window = model.cfg.seq_len
    for _ in range(new_tokens):
        logits = model(torch.tensor([out[-window:]], dtype=torch.long))[0, -1].double()
        if temperature <= 0:
            nxt = int(logits.argmax())
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = int(torch.multinomial(probs, 1, generator=gen))
        out.append(nxt)
    return out[len(ids):]


def sample_text(model: Decoder, tokenizer: Tokenizer, prompt: str, new_tokens: int, temperature: float = 0.0,
                seed: int = 0) -> str:
    """The text the model writes after ``prompt`` (the prompt itself not included)."""
    ids = [int(i) for i in tokenizer.encode(prompt)]
    return str(tokenizer.decode(generate(model, ids, new_tokens, temperature, seed)))


PROMPTS = ("ROMEO:\n", "First Citizen:\n")


class Sample(TypedDict):
    """One entry of the report's ``samples``."""
    window: int
    prompt: str
    temperature: float
    seed: int
    text: str


def samples_from(model: Decoder, tokenizer: Tokenizer, window: int, prompts: Sequence[str] = PROMPTS,
                 new_tokens: int = 160, temperature: float = 0.8, seed: int = 0) -> list[Sample]:
    """The report's ``samples``: one temperature sample per prompt, the i-th with seed ``seed + i`` (one
    seed for all would draw the same random numbers: a model that barely reads its context would write the
    same text after every prompt)."""
    return [Sample(window=window, prompt=p, temperature=temperature, seed=seed + i,
                   text=sample_text(model, tokenizer, p, new_tokens, temperature, seed + i))
            for i, p in enumerate(prompts)]


def checkpoint_window(path: str | Path) -> int | None:
    """The window a ``w<window>/model.safetensors`` checkpoint holds, None if its folder does not say."""
    match = re.fullmatch(r"w(\d+)", find_checkpoint(path).parent.name)
    return int(match.group(1)) if match else None


def run_config(checkpoint: str | Path, config: str | Path | None) -> Config:
    """The run's Config: ``config`` (a run's config.json), else the first config.json above the checkpoint
    (a local network's run folder holds one), else the defaults."""
    from dso.config.schema import Config
    from dso.config.sources import from_dict, load_file

    if config is None:
        start = Path(checkpoint).resolve()
        config = next((d / "config.json" for d in start.parents if (d / "config.json").is_file()), None)
    if config is None:
        return Config().validate()
    data = load_file(config)
    if not isinstance(data, dict):
        raise CheckpointError(f"{config}: not a JSON object")
    return from_dict({k: v for k, v in data.items() if k in ("hparams", "data")})


def main(argv: list[str] | None = None) -> int:
    import argparse

    from dso.data.dataset import Dataset

    p = argparse.ArgumentParser(prog="scripts/sample.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="model.safetensors, a validator state folder or a run folder")
    p.add_argument("--prompt", action="append", default=None, help="text to continue (repeatable)")
    p.add_argument("--tokens", type=int, default=200, help="tokens to generate (default 200)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--config", default=None, help="the run's config.json (default: found above the checkpoint)")
    args = p.parse_args(argv)
    try:
        cfg = run_config(args.checkpoint, args.config)
        model = load_model(args.checkpoint, cfg.hparams)
    except (CheckpointError, OSError, ValueError) as e:
        p.error(str(e))
    tokenizer = Dataset.for_run(cfg.hparams, cfg.data.corpus, cfg.data.cache_dir, cfg.data.tokenizer_file).tokenizer
    for prompt in args.prompt or list(PROMPTS):
        text = sample_text(model, tokenizer, prompt, args.tokens, args.temperature, args.seed)
        print(f"--- prompt {prompt!r} (temperature {args.temperature}, seed {args.seed})\n{prompt}{text}\n")
    return 0
