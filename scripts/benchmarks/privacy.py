"""Privacy section: what a miner's differential privacy costs the network (docs/extensions.md §3).

* ``placement``: one miner's real gradients on its assigned data at θ_0 for R windows, sent with error
  feedback; the cosine between what its uploads add up to (decoded) and the sum of its true gradients, with
  the noise where the miner puts it (on the clipped update, before error feedback and the codec) and where
  ZIP-400 puts it (in a random projection to d values per tensor, after error feedback: the update is
  projected, each tensor's sketch clipped to C/√T so the whole sketch stays within C, then noised).  Same z,
  so the same ε, in every row.
* ``training``: validation loss of N honest peers (sim/training.py: the miners' code path, signed
  aggregation) without DP, with DP at ε = 8 (δ = dp.delta) spent over the run's windows, and at a noise
  multiplier small enough to train (its ε is reported).  Losses in nats per byte (= per token: the model
  reads bytes) and bits per byte.
"""
from __future__ import annotations

import math
from pathlib import Path

from benchmarks.common import ROOT, finite_or_none, save_plot, worker_pool

FULL = {"rounds": 12, "windows": 20, "peers": 4, "tiny": False}
QUICK = {"rounds": 2, "windows": 3, "peers": 2, "tiny": True}
TARGET_EPSILON = 8.0
TRAINING_Z = 0.003    # a noise multiplier small enough to train (its ε is reported)
PLACEMENT_ZS = (0.003, 0.01)
SKETCH_DIMS = (4096, 256)
PLOT = ROOT / "docs" / "img" / "privacy.png"


def hparams(tiny: bool):
    from dso.config.schema import HParams, ModelConfig
    hp = HParams()
    if tiny:
        hp.model = ModelConfig(d_model=32, n_layers=1, n_heads=2, ffn_hidden=64, seq_len=32)
        hp.batch_size, hp.assigned_sequences, hp.micro_batch, hp.chunk, hp.topk = 8, 16, 8, 16, 8
    return hp


def epsilon_for(z: float, rounds: int, delta: float) -> float:
    from dso.privacy.rdp import epsilon_of
    return epsilon_of(z, rounds, delta, range(2, 128))


# ------------------------------------------------------------ placement
def sketch_dp_codec(shapes, dim: int, z: float, clip: float, seed: int):
    """The sketch codec with ZIP-400's noise placement: clip each tensor's sketch to C/√T, add N(0, (zC)²)."""
    import torch

    from dso.codec.sketch import SketchCodec, SketchUpdate, stochastic_quantise

    per_tensor = clip / math.sqrt(len(shapes))
    noise = torch.Generator().manual_seed(seed)

    class NoisySketch(SketchCodec):
        def compress_tensor(self, name, x, window, uid=0, generator=None):
            y = self.project(name, x, window)
            norm = float(torch.linalg.vector_norm(y))
            y = y * min(1.0, per_tensor / norm) if norm > 0 else y
            y = y + torch.randn(y.shape, generator=noise) * (z * clip)
            codes, scale = stochastic_quantise(y, self.bits, self.rounding_generator(window, uid, name))
            return SketchUpdate(codes, scale, int(window))

    return NoisySketch(shapes, dim=dim, clip=1e30, bits=8, seed=seed)


def placement(rounds: int, tiny: bool) -> dict:
    """In a worker: the cosine table (see the module docstring)."""
    from benchmarks.common import default_dataset, setup_worker
    setup_worker()
    import torch

    from dso.codec.demo import DeMoCodec, ErrorFeedback
    from dso.codec.sketch import SketchCodec
    from dso.nn.model import build_model, parameter_shapes
    from dso.privacy.dp import clip_and_noise, global_norm
    from dso.privacy.rdp import noise_for_target
    from dso.training.train import compute_gradients

    hp = hparams(tiny)
    model = build_model(hp.model, hp.seed)
    shapes = parameter_shapes(model)
    dataset = default_dataset(hp)
    grads = [compute_gradients(model, dataset.training_batch(1, t, hp.assigned_sequences, hp.batch_size),
                               hp.micro_batch)[0] for t in range(rounds)]
    clip = sorted(global_norm(g) for g in grads)[len(grads) // 2]  # C at the median norm: the clip binds half the time

    def flat(d):
        return torch.cat([d[k].reshape(-1).double() for k in shapes])

    truth = sum(flat(g) for g in grads)

    def cosine(codec, z: float, noise_on_update: bool) -> float:
        feedback, gen = ErrorFeedback(codec, hp.ef_beta), torch.Generator().manual_seed(7)
        sent = torch.zeros_like(truth)
        for t, g in enumerate(grads):
            g = clip_and_noise(g, clip, z, gen) if noise_on_update and z > 0 else g
            sent += flat(codec.decompress(feedback.step(g, t, 1)))
        return float(torch.nn.functional.cosine_similarity(sent, truth, dim=0))

    demo, sketch = DeMoCodec.from_hparams(shapes, hp), SketchCodec(shapes, dim=4096, clip=1e30, bits=8, seed=1)
    z8 = noise_for_target(TARGET_EPSILON, hp.dp.delta, 100, range(2, 128))
    rows = [{"z": 0.0, "epsilon": None, "demo_update": cosine(demo, 0.0, True),
             "sketch4096_update": cosine(sketch, 0.0, True)}]
    for z in (z8, *PLACEMENT_ZS):
        row = {"z": z, "epsilon": epsilon_for(z, 100, hp.dp.delta), "demo_update": cosine(demo, z, True),
               "sketch4096_update": cosine(sketch, z, True)}
        for dim in SKETCH_DIMS:
            row[f"sketch{dim}_in_sketch"] = cosine(sketch_dp_codec(shapes, dim, z, clip, 1), z, False)
        rows.append(row)
    return {"rounds": rounds, "parameters": sum(math.prod(s) for s in shapes.values()), "tensors": len(shapes),
            "clip": clip, "rows": rows}


# ------------------------------------------------------------- training
def train(windows: int, peers: int, tiny: bool, z: float | None) -> dict:
    """In a worker: validation loss per window; ``z`` None = no DP."""
    from benchmarks.common import default_dataset, setup_worker
    setup_worker()
    from sim.training import run_honest

    hp = hparams(tiny)
    if z is not None:
        hp.dp.enabled, hp.dp.target_epsilon, hp.dp.noise_multiplier = True, 0.0, z
    hist = run_honest(hp, default_dataset(hp), peers, windows)
    return {"val_loss": [finite_or_none(x) for x in hist.val_loss], "seconds": hist.seconds}


def run(quick: bool) -> dict:
    from dso.config.schema import HParams
    from dso.privacy.rdp import noise_for_target

    cfg = QUICK if quick else FULL
    delta, w = HParams().dp.delta, cfg["windows"]
    z8 = noise_for_target(TARGET_EPSILON, delta, w, range(2, 128))
    variants = {"no_dp": None, "dp_eps8": z8, f"dp_z{TRAINING_Z:g}": TRAINING_Z}
    with worker_pool(2) as pool:
        table = pool.submit(placement, cfg["rounds"], cfg["tiny"])
        futures = {k: pool.submit(train, w, cfg["peers"], cfg["tiny"], z) for k, z in variants.items()}
        runs = {k: f.result() for k, f in futures.items()}
        out = {"placement": table.result()}
    curves = {k: r["val_loss"] for k, r in runs.items()}
    out["training"] = {
        "windows": w, "peers": cfg["peers"], "delta": delta, "tiny_model": cfg["tiny"],
        "z": {k: z for k, z in variants.items()},
        "epsilon": {k: (None if z is None else epsilon_for(z, w, delta)) for k, z in variants.items()},
        "initial": curves["no_dp"][0],
        "final": {k: c[-1] for k, c in curves.items()},
        "final_bits_per_byte": {k: None if c[-1] is None else c[-1] / math.log(2) for k, c in curves.items()},
        "seconds": {k: r["seconds"] for k, r in runs.items()},
        "curves": curves,
    }
    out["dp_eps8_final_minus_initial"] = (None if None in (curves["dp_eps8"][-1], curves["dp_eps8"][0])
                                          else curves["dp_eps8"][-1] - curves["dp_eps8"][0])
    out["peers_to_average_eps8_noise_down_to_z"] = (z8 / TRAINING_Z) ** 2  # noise of N peers' mean: z/√N
    if not quick:
        plot(out["training"], PLOT)
        out["plot"] = str(PLOT.relative_to(ROOT))
    return out


def plot(training: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for key, curve in training["curves"].items():
        eps = training["epsilon"][key]
        label = "no DP" if eps is None else \
            f"DP, z = {training['z'][key]:.3g} (ε = {eps:.3g} at δ = {training['delta']:g})"
        ax.plot([i for i, y in enumerate(curve) if y is not None], [y for y in curve if y is not None], label=label)
    save_plot(fig, ax, path, "windows completed", "validation loss (nats/byte)",
              f"Training under per-miner DP: {training['peers']} honest peers")


def markdown(result: dict) -> str:
    def f(x, spec=".4f"):
        return "—" if x is None else format(x, spec)
    p, t = result["placement"], result["training"]
    dims = [k for k in p["rows"][-1] if k.endswith("_in_sketch")]
    lines = [f"**Placement** ({p['rounds']} windows of one miner, {p['parameters']:,} parameters, C = "
             f"{p['clip']:.3g}): cosine(Σ true gradients, Σ decoded uploads)", "",
             "| z | ε (100 rounds) | DeMo, noise on update | sketch 4096, noise on update | "
             + " | ".join(d.replace("_in_sketch", ", noise in sketch") for d in dims) + " |",
             "|---:|---:|---:|---:|" + "---:|" * len(dims)]
    for r in p["rows"]:
        lines.append(f"| {r['z']:.4g} | {f(r['epsilon'], '.3g')} | {r['demo_update']:+.4f} | "
                     f"{r['sketch4096_update']:+.4f} | " + " | ".join(f(r.get(d), '+.4f') for d in dims) + " |")
    lines += ["", f"**Training** ({t['peers']} peers, {t['windows']} windows, δ = {t['delta']:g}): validation loss "
              f"from {f(t['initial'])}", "", "| run | z | ε | final (nats/byte) | bits/byte |",
              "|---|---:|---:|---:|---:|"]
    for key, final in t["final"].items():
        lines.append(f"| {key} | {f(t['z'][key], '.4g')} | {f(t['epsilon'][key], '.4g')} | {f(final)} | "
                     f"{f(t['final_bits_per_byte'][key])} |")
    lines.append(f"\nPeers whose mean would bring the noise of ε = 8 over {t['windows']} windows down to "
                 f"z = {TRAINING_Z:g}: {result['peers_to_average_eps8_noise_down_to_z']:.3g}")
    return "\n".join(lines)
