#!/usr/bin/env python
"""Which tokeniser gives the lowest validation loss per byte at equal compute (docs/data.md)?

    python scripts/compare_tokenizers.py [--cpu-seconds 150] [--vocab 256 512 1024 2048 4096] [--out FILE]

For each vocabulary (256 = the byte tokeniser, larger = a byte-level BPE trained on the corpus), trains
the default model shape (``HParams().model`` with that vocabulary) on the default Shakespeare corpus
with centralised AdamW — batches of ``batch_size`` sequences of ``seq_len`` tokens, one torch thread —
until its training has used ``--cpu-seconds`` of CPU time (evaluation excluded), and reports the
validation loss in nats per token and bits per byte at several points of that budget.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from dso.config.schema import HParams  # noqa: E402
from dso.data.dataset import Dataset  # noqa: E402
from dso.data.tokenizer import TokenizerSpec  # noqa: E402
from dso.nn.model import build_model, parameter_count  # noqa: E402
from dso.training.train import bits_per_byte, evaluate  # noqa: E402


def run_one(vocab: int, cpu_seconds: float, checkpoints: int, val_sequences: int, lr: float, seed: int,
            cache_dir: str) -> dict:
    hp = HParams(seed=seed)
    hp.model.vocab_size = vocab
    spec = TokenizerSpec("bytes" if vocab == 256 else "bpe", vocab)
    started = time.perf_counter()
    ds = Dataset.from_config("shakespeare", cache_dir, hp.model.seq_len, hp.seed, hp.val_fraction, tokenizer=spec)
    prep = time.perf_counter() - started
    model = build_model(hp.model, hp.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    val = ds.validation(val_sequences)
    val_bytes = ds.target_bytes(val)
    val_tokens = val.shape[0] * (val.shape[1] - 1)
    curve, used, step = [], 0.0, 0
    marks = [cpu_seconds * (i + 1) / checkpoints for i in range(checkpoints)]
    warmup = 20
    while marks:
        c0 = time.process_time()
        batch = ds.assigned(0, step, hp.batch_size)
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / warmup)
        loss = model.loss(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        used += time.process_time() - c0
        if used >= marks[0]:
            marks.pop(0)
            model.eval()
            nats = evaluate(model, val, hp.micro_batch)
            model.train()
            curve.append({"cpu_seconds": round(used, 1), "steps": step, "nats_per_token": round(nats, 4),
                          "bits_per_byte": round(bits_per_byte(nats, val_tokens, val_bytes), 4),
                          "train_bytes_seen": step * hp.batch_size * round(val_bytes / val_tokens * hp.model.seq_len)})
            print(f"vocab {vocab}: {curve[-1]}", file=sys.stderr, flush=True)
    return {"vocab_size": vocab, "tokenizer": spec.describe(), "parameters": parameter_count(model),
            "bytes_per_token": round(val_bytes / val_tokens, 3), "sequences": ds.n_sequences,
            "prepare_seconds": round(prep, 1), "curve": curve, "final": curve[-1]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-seconds", type=float, default=150.0)
    p.add_argument("--checkpoints", type=int, default=5)
    p.add_argument("--vocab", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    p.add_argument("--val-sequences", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--cache-dir", default="~/.cache/dso")
    p.add_argument("--out", default="tokenizer-comparison.json")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    results = {"cpu_seconds": args.cpu_seconds, "lr": args.lr, "seed": args.seed,
               "optimizer": "AdamW(0.9, 0.95), wd 0.1",
               "load_average_at_start": [round(x, 2) for x in os.getloadavg()], "runs": []}
    for vocab in args.vocab:
        results["runs"].append(run_one(vocab, args.cpu_seconds, args.checkpoints, args.val_sequences, args.lr,
                                       args.seed, args.cache_dir))
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print("| tokeniser | bytes/token | params | steps | nats/token | bits/byte |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results["runs"]:
        f = r["final"]
        print(f"| {r['tokenizer']} | {r['bytes_per_token']} | {r['parameters'] / 1e6:.2f} M | {f['steps']} | "
              f"{f['nats_per_token']} | {f['bits_per_byte']} |")
    best = min(results["runs"], key=lambda r: r["final"]["bits_per_byte"])
    print(f"lowest bits per byte: {best['tokenizer']} ({best['final']['bits_per_byte']})")
    return 0 if all(math.isfinite(r["final"]["bits_per_byte"]) for r in results["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
