"""How much of the error-feedback buffer's energy each codec setting sends per round.

Per round r, with the buffer ``E = β·e + g``: ``share = 1 − ‖E − IDCT(q̂)‖² / ‖E‖²`` over the whole
model, where q̂ are the values actually sent (quantisation error counts against the setting; a bad
quantiser can make it negative).  Streams are real updates of the default model on the default
corpus: inner-loop pseudo-gradients (``steps`` AdamW steps per round) and plain gradients (the
first step's, i.e. paper mode).
"""
from __future__ import annotations

import torch


def record_updates(rounds: int, steps: int = 3, lr: float = 2e-3, hp=None) -> dict[str, list[dict[str, torch.Tensor]]]:
    """One peer training with AdamW: per round its pseudo-gradient and its first gradient."""
    from benchmarks.common import default_dataset
    from dso.config.schema import HParams
    from dso.nn.model import build_model

    hp = hp or HParams()
    dataset = default_dataset(hp)
    model = build_model(hp.model, hp.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95))
    out: dict[str, list] = {"pseudo": [], "gradient": []}
    for r in range(rounds):
        anchor = {n: p.detach().clone() for n, p in model.named_parameters()}
        data = dataset.assigned(0, r, steps * hp.batch_size)
        for i in range(steps):
            model.zero_grad(set_to_none=True)
            model.loss(data[i * hp.batch_size:(i + 1) * hp.batch_size]).backward()
            if i == 0:
                out["gradient"].append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
            opt.step()
        out["pseudo"].append({n: anchor[n] - p.detach() for n, p in model.named_parameters()})
    return out


def sent_shares(stream: list[dict[str, torch.Tensor]], codec, beta: float) -> list[float]:
    """Energy share sent in each round by error feedback with ``codec``."""
    from dso.codec.demo import ErrorFeedback

    ef = ErrorFeedback(codec, beta)
    shares = []
    for r, g in enumerate(stream):
        before = sum(float((b * beta + g[n]).double().square().sum()) for n, b in ef.buffers.items())
        ef.step(g, r)
        after = sum(float(b.double().square().sum()) for b in ef.buffers.values())
        shares.append(1.0 - after / before if before > 0 else 0.0)
    return shares


def energy_table(streams: dict[str, list], topks, bits, skip: int = 1, beta: float | None = None, hp=None) -> dict:
    """Rows ``<stream> <dct|raw> top-k``, columns value bits: mean share over rounds ``skip``…;
    plus the raw ÷ DCT ratio at each top-k with 4-bit values."""
    from dso.codec.demo import DeMoCodec
    from dso.config.schema import HParams

    hp = hp or HParams()
    beta = hp.ef_beta if beta is None else beta
    shapes = {n: tuple(t.shape) for n, t in next(iter(streams.values()))[0].items()}
    rows: dict[str, list[float]] = {}
    for stream_name, stream in streams.items():
        for dct in (True, False):
            for k in topks:
                label = f"{stream_name} {'dct' if dct else 'raw'} top-{k}"
                rows[label] = []
                for b in bits:
                    codec = DeMoCodec(shapes, chunk=hp.chunk, topk=k, value_bits=b, dct=dct)
                    shares = sent_shares(stream, codec, beta)[skip:]
                    rows[label].append(sum(shares) / len(shares))
    columns = [f"{b} bit" if b != 32 else "float32" for b in bits]
    ref = bits.index(4) if 4 in bits else 0
    raw_vs_dct = {f"{s} top-{k}": rows[f"{s} raw top-{k}"][ref] / rows[f"{s} dct top-{k}"][ref]
                  for s in streams for k in topks if rows[f"{s} dct top-{k}"][ref] > 0}
    return {"columns": columns, "rows": rows, "raw_vs_dct": raw_vs_dct, "beta": beta, "rounds_averaged_from": skip}
