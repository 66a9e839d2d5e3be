#!/usr/bin/env python
"""How strong is the proof-of-computation signal?  (The measurement behind docs/scoring.md.)

    python scripts/poc_signal.py [--beta 0.999] [--warm 10] [--draws 10]

Four baseline peers (train on `batch_size` of their assignment) and four that
process twice as much (the whole assignment) train together for `--warm`
windows.  Then, for each peer's next update, the validator's test quantity
``δ_assigned − δ_rand`` is measured over `--draws` random draws of D_assigned
and D_rand, with D_assigned taken either from the baseline part of the
assignment (A) or from the whole assignment (B, what the validator does).
Prints the mean, the share of positive draws and E[sign] — the drift of μ.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from dso.aggregation import aggregate_signs, signed_step  # noqa: E402
from dso.codec import DeMoCodec, ErrorFeedback  # noqa: E402
from dso.config import HParams  # noqa: E402
from dso.data import Dataset  # noqa: E402
from dso.model import build_model, parameter_shapes  # noqa: E402
from dso.train import compute_gradients, evaluate, learning_rate  # noqa: E402
from scoring.evaluation import ParameterSnapshot  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--beta", type=float, default=HParams().ef_beta)
    p.add_argument("--warm", type=int, default=10)
    p.add_argument("--draws", type=int, default=10)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    hp = HParams(ef_beta=args.beta)
    ds = Dataset.for_run(hp, "shakespeare", "~/.cache/dso")
    model = build_model(hp.model, hp.seed)
    codec = DeMoCodec.from_hparams(parameter_shapes(model), hp)
    batches = {uid: (1 if uid < 4 else 2) for uid in range(8)}
    feedback = {uid: ErrorFeedback(codec, hp.ef_beta) for uid in batches}

    def update(uid: int, t: int):
        data = ds.training_batch(uid, t, hp.assigned_sequences, hp.batch_size * batches[uid])
        grads, _ = compute_gradients(model, data, hp.micro_batch)
        return feedback[uid].step(grads, t, uid)

    for t in range(args.warm):
        signed_step(model, aggregate_signs(codec, [update(u, t) for u in batches], hp)[0], learning_rate(hp, t))
    t, rng, results = args.warm, np.random.default_rng(1), {}
    step = hp.eval_scale * learning_rate(hp, t)
    for uid in batches:
        signs = {n: torch.sign(d) for n, d in codec.decompress(update(uid, t)).items()}
        pool = ds.assigned(uid, t, hp.assigned_sequences)
        snapshot = ParameterSnapshot(model)
        for mode, span in (("A: baseline part", hp.batch_size), ("B: whole assignment", hp.assigned_sequences)):
            for _ in range(args.draws):
                rows = np.sort(rng.choice(span, hp.eval_sequences, replace=False))
                assigned = pool[torch.from_numpy(rows)]
                rand = ds.unassigned(rng, ds.assigned_rows(uid, t, hp.assigned_sequences), hp.eval_sequences)
                before = evaluate(model, assigned, hp.micro_batch), evaluate(model, rand, hp.micro_batch)
                with torch.no_grad():
                    for name, prm in model.named_parameters():
                        prm.sub_(signs[name], alpha=step)
                after = evaluate(model, assigned, hp.micro_batch), evaluate(model, rand, hp.micro_batch)
                snapshot.restore()
                kind = "baseline" if batches[uid] == 1 else "2x data"
                results.setdefault((mode, kind), []).append((before[0] - after[0]) - (before[1] - after[1]))
    print(f"| β = {hp.ef_beta} | peers | mean δ_a − δ_r | P(> 0) | E[sign] |\n|---|---|---:|---:|---:|")
    for (mode, kind), diffs in sorted(results.items()):
        d = np.array(diffs)
        print(f"| {mode} | {kind} | {d.mean():.2e} | {(d > 0).mean():.2f} | {np.sign(d).mean():.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
