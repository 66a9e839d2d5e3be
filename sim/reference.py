"""The local run's reference curve: one centralised AdamW run of the same model on as many tokens as the
network's honest and diligent miners trained on.

After the network has stopped, ``sim.training.run_ddp`` with one peer — plain AdamW with the inner
optimiser's settings (lr, betas, warm-up, clipping), ``batch_size`` sequences per step, the run's θ_0
and its validation batch — trains in rounds of ``ROUND_STEPS`` steps, each round on its own assigned
sequences, and records the validation loss after each round.  The curve for more tokens extends the one
for fewer, so one curve serves every run with the same settings: a run reads its prefix, and the last
point is interpolated at exactly the network's token count.

The training runs on every core (the nodes are gone) for at most ``seconds``; a curve cut short says so
(``complete: false``) and is not cached.  A complete curve is cached in the data cache, keyed by the
settings that change it (:func:`settings`).  The curve for the default settings ships with the code
(``sim/reference_cache``, made by ``python -m sim.reference``), so a fresh clone's ``make run`` draws the
whole curve without spending minutes on it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dso.config.schema import HParams

if TYPE_CHECKING:
    from dso.data.dataset import Dataset

REFERENCE_SECONDS = 90.0  # the longest the reference may add to `make run` when no cached curve is long enough
ROUND_STEPS = 32          # AdamW steps between two points of the curve (65,536 tokens at the defaults)
SHIPPED = Path(__file__).resolve().parent / "reference_cache"  # curves shipped for the default settings
CURVE_KEYS = ("tokens", "val_loss", "bits_per_byte")


def settings(hp: HParams, data_hash: str) -> dict[str, Any]:
    """Everything the reference's trajectory depends on (and nothing else, so a run's other settings — windows,
    peers, scoring — share one curve)."""
    return {"model": asdict(hp.model), "seed": hp.seed, "tokenizer": hp.tokenizer, "data": data_hash,
            "batch_size": hp.batch_size, "micro_batch": hp.micro_batch, "assigned_sequences": hp.assigned_sequences,
            "inner": asdict(hp.inner), "val_sequences": hp.val_sequences, "val_fraction": hp.val_fraction,
            "round_steps": ROUND_STEPS}


def cache_name(hp: HParams, data_hash: str) -> str:
    digest = hashlib.sha256(json.dumps(settings(hp, data_hash), sort_keys=True).encode()).hexdigest()[:20]
    return f"adamw-{digest}.json"


def rounds_for(hp: HParams, dataset: Dataset, tokens: int) -> int:
    """Rounds of ``ROUND_STEPS`` steps a curve needs to reach ``tokens`` training tokens."""
    return math.ceil(tokens / (ROUND_STEPS * hp.batch_size * dataset.seq_len))


def store(curve: dict[str, Any], folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(curve))
    return folder / name


def read_cached(path: Path, rounds: int) -> dict[str, Any] | None:
    """A complete cached curve with at least ``rounds`` rounds, else None (missing, unreadable, malformed)."""
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cached, dict) or cached.get("complete") is not True:
        return None
    curves = [cached.get(k) for k in CURVE_KEYS]
    first = curves[0]
    if not isinstance(first, list) or not all(
            isinstance(c, list) and len(c) == len(first) and all(isinstance(x, (int, float)) for x in c)
            for c in curves):
        return None
    return cached if len(first) >= rounds + 1 else None


def at_tokens(curve: dict[str, Any], tokens: int) -> dict[str, Any]:
    """The curve up to ``tokens``: the points before it, and one at exactly ``tokens`` interpolated between
    its neighbours (the curve must reach it)."""
    xs = curve["tokens"]
    keep = sum(1 for x in xs if x < tokens)
    out = {k: list(curve[k][:keep]) for k in CURVE_KEYS}
    out["tokens"].append(tokens)
    for k in ("val_loss", "bits_per_byte"):
        out[k].append(float(np.interp(tokens, xs, curve[k])))
    return out


def adamw_reference(hp: HParams, dataset: Dataset, tokens: int, cache_dir: str | Path,
                    seconds: float = REFERENCE_SECONDS, say: Callable[[str], None] = print,
                    shipped: Path | None = SHIPPED) -> dict[str, Any] | None:
    """The reference curve on ``tokens`` training tokens: {tokens, val_loss (nats/token), bits_per_byte,
    target_tokens, steps, complete, seconds, cached}; None when the network trained on no tokens."""
    if tokens <= 0:
        return None
    per_step = hp.batch_size * dataset.seq_len
    rounds = rounds_for(hp, dataset, tokens)
    name = cache_name(hp, dataset.data_hash)
    places = [Path(cache_dir).expanduser() / "reference"] + ([shipped] if shipped is not None else [])
    cached = None
    for place in places:  # the first long-enough curve: the data cache's, else the shipped one
        if (cached := read_cached(place / name, rounds)) is not None:
            say(f"reference: centralised AdamW on {tokens:,} tokens, read from {place / name}")
            break
    if cached is not None:
        curve = cached
    else:
        curve = train_curve(hp, dataset, rounds, seconds, say)
        if curve["complete"]:
            store(curve, places[0], name)
    if curve["complete"]:  # (a cut curve does not reach the network's tokens)
        curve = {**curve, **at_tokens(curve, tokens), "steps": math.ceil(tokens / per_step)}
    return {**curve, "target_tokens": tokens, "cached": cached is not None}


def train_curve(hp: HParams, dataset: Dataset, rounds: int, seconds: float,
                say: Callable[[str], None]) -> dict[str, Any]:
    """``rounds`` rounds of centralised AdamW (at most ``seconds``), on every core."""
    import torch

    from dso.training.train import bits_per_byte
    from sim.training import run_ddp

    per_round = ROUND_STEPS * hp.batch_size * dataset.seq_len
    say(f"reference: centralised AdamW, {rounds} rounds of {ROUND_STEPS} steps of {hp.batch_size} sequences "
        f"({rounds * per_round:,} tokens" + (f", at most {seconds:g} s)" if math.isfinite(seconds) else ")"))
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    try:
        hist = run_ddp(hp, dataset, 1, rounds, ROUND_STEPS, until=time.perf_counter() + seconds,
                       on_window=lambda t, loss: say(f"reference: round {t + 1}/{rounds}, loss {loss:.4f}"))
    finally:
        torch.set_num_threads(threads)
    val = dataset.validation(hp.val_sequences)
    per_nat = bits_per_byte(1.0, int(val[:, 1:].numel()), dataset.target_bytes(val))
    return {"tokens": hist.tokens, "val_loss": hist.val_loss, "bits_per_byte": [x * per_nat for x in hist.val_loss],
            "steps": ROUND_STEPS * (len(hist.tokens) - 1), "batch_sequences": hp.batch_size, "lr": hp.inner.lr,
            "round_steps": ROUND_STEPS, "complete": len(hist.tokens) == rounds + 1, "seconds": round(hist.seconds, 1)}


def network_tokens(miners: Mapping[int, Sequence[Mapping[str, Any]]], good: set[int]) -> dict[int, int]:
    """window → training tokens the ``good`` miners processed in it (from their JSON lines)."""
    per_window: dict[int, int] = {}
    for uid, lines in miners.items():
        if uid not in good:
            continue
        for line in lines:
            if isinstance(line.get("window"), int) and isinstance(line.get("tokens"), int):
                per_window[line["window"]] = per_window.get(line["window"], 0) + line["tokens"]
    return per_window


def on_windows(reference_tokens: list[int], per_window: dict[int, int]) -> list[float]:
    """Where each reference point lies on the network's window axis: the window by whose end the network had
    processed as many tokens (linear in between; the first point, 0 tokens, is the start of the first window)."""
    if not per_window:
        return []
    windows = sorted(per_window)
    xs = [windows[0] - 1.0] + [float(w) for w in windows]
    cumulative = np.cumsum([0] + [per_window[w] for w in windows]).astype(float)
    return [float(x) for x in np.interp(reference_tokens, cumulative, xs)]


def main(argv: list[str] | None = None) -> int:
    """Make (or extend) the cached curve for a run's settings: ``python -m sim.reference --tokens N``."""
    from dso.config.schema import Config, ConfigError
    from dso.config.sources import set_hparams
    from dso.data.corpus import DataError
    from dso.data.dataset import Dataset

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--tokens", type=int, required=True, help="training tokens the curve must reach")
    p.add_argument("--set", action="append", default=[], metavar="hparams.KEY=VALUE")
    p.add_argument("--data.corpus", dest="corpus", default="shakespeare")
    p.add_argument("--data.cache_dir", dest="cache_dir", default="~/.cache/dso")
    p.add_argument("--out", default="", help="folder to write the curve to (default: the data cache)")
    args = p.parse_args(argv)
    cfg = Config()
    try:
        set_hparams(cfg, args.set)
        hp = cfg.validate().hparams
        dataset = Dataset.for_run(hp, args.corpus, args.cache_dir, "")
    except (ConfigError, DataError) as e:
        p.error(str(e))
    out = Path(args.out) if args.out else Path(args.cache_dir).expanduser() / "reference"
    curve = train_curve(hp, dataset, rounds_for(hp, dataset, args.tokens), math.inf,
                        lambda line: print(line, file=sys.stderr, flush=True))
    print(store(curve, out, cache_name(hp, dataset.data_hash)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
