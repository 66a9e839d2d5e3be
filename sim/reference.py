"""The local run's reference curve: one centralised AdamW run of the same model on as many tokens as the
network's honest and diligent miners trained on (issue 13).

After the network has stopped, ``sim.training.run_ddp`` with one peer — plain AdamW with the inner
optimiser's settings (lr, betas, warm-up, clipping), ``batch_size`` sequences per step, the run's θ_0
and its validation batch — takes ``ceil(tokens / (batch_size · seq_len))`` steps spread over the run's
windows, and records the validation loss after each window's share.  It runs on every core (the nodes
are gone) for at most ``seconds``; a curve cut short says so (``complete: false``) and is not cached.
A complete curve is cached in the data cache, keyed by the hyper-parameters, data and token count, so a
second run with the same settings costs nothing.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

from dso.config import HParams

REFERENCE_SECONDS = 90.0  # the longest the reference may add to `make run` (an idle 2-core machine finishes)


def cache_file(cache_dir: str | Path, hp: HParams, data_hash: str, tokens: int, windows: int) -> Path:
    key = json.dumps({"hp": asdict(hp), "data": data_hash, "tokens": tokens, "windows": windows}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    return Path(cache_dir).expanduser() / "reference" / f"adamw-{digest}.json"


def read_cached(path: Path) -> dict[str, Any] | None:
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return cached if isinstance(cached, dict) and cached.get("complete") is True else None


def adamw_reference(hp: HParams, dataset: Any, tokens: int, windows: int, cache_dir: str | Path,
                    seconds: float = REFERENCE_SECONDS, say: Callable[[str], None] = print) -> dict[str, Any] | None:
    """The reference curve: {tokens, val_loss (nats/token), bits_per_byte, target_tokens, steps, complete,
    seconds, cached}; None when the network trained on no tokens."""
    import torch

    from dso.train import bits_per_byte
    from sim.training import run_ddp

    if tokens <= 0 or windows <= 0:
        return None
    path = cache_file(cache_dir, hp, dataset.data_hash, tokens, windows)
    cached = read_cached(path)
    if cached is not None:
        return {**cached, "cached": True}
    per_step = hp.batch_size * dataset.seq_len
    steps = max(1, math.ceil(tokens / per_step / windows))  # per window
    say(f"reference: centralised AdamW on {tokens:,} tokens ({steps * windows} steps of {hp.batch_size} sequences, "
        f"at most {seconds:.0f} s)")
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    try:
        hist = run_ddp(hp, dataset, 1, windows, steps, until=time.perf_counter() + seconds,
                       on_window=lambda t, loss: say(f"reference: window {t + 1}/{windows}, loss {loss:.4f}"))
    finally:
        torch.set_num_threads(threads)
    val = dataset.validation(hp.val_sequences)
    per_nat = bits_per_byte(1.0, int(val[:, 1:].numel()), dataset.target_bytes(val))
    out = {"tokens": hist.tokens, "val_loss": hist.val_loss, "bits_per_byte": [x * per_nat for x in hist.val_loss],
           "target_tokens": tokens, "steps": steps * (len(hist.tokens) - 1), "batch_sequences": hp.batch_size,
           "lr": hp.inner.lr, "complete": len(hist.tokens) == windows + 1, "seconds": round(hist.seconds, 1)}
    if out["complete"]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out))
    return {**out, "cached": False}


def network_tokens(miners: dict[int, list[dict]], good: set[int]) -> dict[int, int]:
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
