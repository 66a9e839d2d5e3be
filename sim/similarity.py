"""How similar honest updates are to each other, and copies to their sources (docs/scoring.md).

Runs a :class:`~sim.simulator.SimNet` and, in every window, measures on what the validator receives the
three statistics the near-copy test (scoring/copies.py) thresholds: the cosine of two peers' normalised rows,
the R² of the best positive mix of a peer's nearest rows, and the cosine to the previous aggregate.  Honest
peers give the distribution the thresholds must stay clear of; the copying behaviours give where they land.
"""
from __future__ import annotations

import itertools

import numpy as np

from dso.aggregation.robust import decoded_rows, gram
from dso.codec.codecs import DEFAULT_THRESHOLDS
from neurons.engine import _previous_update
from scoring.copies import best_mix, cosines, recompressed_cosine
from sim import behaviours
from sim.simulator import SimNet


def window_statistics(net: SimNet, t: int) -> dict[str, list[float]]:
    """One window of ``net``: the statistics per kind ("honest_pair", "honest_mix", "honest_previous", and the
    copying behaviours' own), then the window is concluded as usual."""
    payloads, rejections = net.uploads(t)
    uids = sorted(payloads)
    previous = _previous_update(net.codec, net.previous_aggregate(), t)
    rows = [payloads[u].update for u in uids] + ([previous] if previous is not None else [])
    R = decoded_rows(net.codec, rows)
    G = gram(R)
    C = cosines(G)
    prev = len(uids) if previous is not None else None
    role = {u: net.roles[u - 1] for u in uids}
    out: dict[str, list[float]] = {}
    good = [a for a, u in enumerate(uids) if role[u] in behaviours.GOOD]
    for a, b in itertools.combinations(good, 2):
        out.setdefault("honest_pair", []).append(float(C[a, b]))
    for a, u in enumerate(uids):
        honest = role[u] in behaviours.GOOD
        kind = "honest" if honest else role[u]
        # among the honest peers only: an honest peer's copiers would fit it perfectly, and the validator drops
        # caught copies from a mix's candidates (scoring/copies.py)
        peers = [b for b in good if b != a]
        r2, sources, _ = best_mix(G, C, a, peers, DEFAULT_THRESHOLDS.nearest, [prev] if prev is not None else [])
        out.setdefault(f"{kind}_mix_r2", []).append(r2)
        out.setdefault(f"{kind}_mix", []).append(recompressed_cosine(net.codec, R, a, sources, t)
                                                 if sources else 0.0)
        out.setdefault(f"{kind}_nearest", []).append(max((float(C[a, b]) for b in peers), default=0.0))
        if prev is not None:
            out.setdefault(f"{kind}_previous", []).append(float(C[a, prev]))
    net.conclude(t, payloads, rejections)
    return out


def measure(net: SimNet, windows: int) -> dict[str, dict[str, float]]:
    """Per statistic: count, min, median, 99th percentile and max over ``windows`` windows."""
    pooled: dict[str, list[float]] = {}
    for t in range(windows):
        for k, values in window_statistics(net, t).items():
            pooled.setdefault(k, []).extend(values)
    return {k: {"n": len(v), "min": float(np.min(v)), "median": float(np.median(v)),
                "p99": float(np.percentile(v, 99)), "max": float(np.max(v))} for k, v in sorted(pooled.items())}


def main(argv: list[str] | None = None) -> int:
    """``python -m sim.similarity [--windows N]``: the statistics on the default model and hyper-parameters."""
    import argparse
    import json

    import torch

    from dso.config.schema import HParams
    from dso.data.dataset import Dataset

    torch.set_num_threads(1)
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--corpus", default="shakespeare")
    parser.add_argument("--cache-dir", default="~/.cache/dso")
    parser.add_argument("--roles", default="honest*6,diligent*2,noisycopy,scaledcopy,mixer,replayer")
    args = parser.parse_args(argv)
    roles = [r for spec in args.roles.split(",") for r in [spec.split("*")[0]] * int((spec.split("*") + ["1"])[1])]
    hp = HParams()
    net = SimNet(hp, Dataset.for_run(hp, args.corpus, args.cache_dir), roles)
    pooled: dict[str, list[float]] = {}
    for t in range(args.windows):
        for k, values in window_statistics(net, t).items():
            pooled.setdefault(k, []).extend(values)
        print(f"window {t}: honest pair max {max(pooled.get('honest_pair', [0.0])):.3f}", flush=True)
    stats = {k: {"n": len(v), "min": round(float(np.min(v)), 3), "median": round(float(np.median(v)), 3),
                 "p99": round(float(np.percentile(v, 99)), 3), "max": round(float(np.max(v)), 3)}
             for k, v in sorted(pooled.items())}
    print(json.dumps({"roles": roles, "windows": args.windows, "inner": hp.inner.mode, "steps_max": hp.inner.steps_max,
                      "value_bits": hp.value_bits, "stats": stats}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
