"""The updates attacks upload, built with the run's codec: zeros, noise, scaled, mixed, replayed, μ − zσ, −ε·μ."""
from __future__ import annotations

import torch

from dso.codec.codecs import Codec, Update
from sim.behaviours.base import ALIE_Z, COPY_NOISE, IPM_EPSILON


def zeros(codec: Codec, window: int) -> Update:
    return codec.compress({n: torch.zeros(s) for n, s in codec.shapes.items()}, window)


def noise(codec: Codec, window: int, generator: torch.Generator, scale: float = 1e-3) -> Update:
    return codec.compress({n: scale * torch.randn(s, generator=generator) for n, s in codec.shapes.items()}, window)


def scaled(codec: Codec, window: int, update: Update, factor: float) -> Update:
    return codec.compress({n: factor * t for n, t in codec.decompress(update).items()}, window)


def alie(codec: Codec, window: int, others: list[Update], z: float = ALIE_Z) -> Update | None:
    """μ − z·σ per coordinate of the readable honest updates (needs at least two)."""
    if len(others) < 2:
        return None
    dense = [codec.decompress(u) for u in others]
    out = {}
    for n in codec.shapes:
        stack = torch.stack([d[n] for d in dense])
        out[n] = stack.mean(0) - z * stack.std(0)
    return codec.compress(out, window)


def ipm(codec: Codec, window: int, others: list[Update], epsilon: float = IPM_EPSILON) -> Update | None:
    if not others:
        return None
    dense = [codec.decompress(u) for u in others]
    return codec.compress({n: -epsilon * torch.stack([d[n] for d in dense]).mean(0) for n in codec.shapes}, window)


def noisy_copy(codec: Codec, window: int, update: Update, generator: torch.Generator,
               relative: float = COPY_NOISE) -> Update:
    """``update`` plus Gaussian noise of ``relative`` × each tensor's RMS, compressed again."""
    out = {}
    for n, t in codec.decompress(update).items():
        rms = t.float().pow(2).mean().sqrt()
        out[n] = t + relative * rms * torch.randn(t.shape, generator=generator)
    return codec.compress(out, window)


def mix(codec: Codec, window: int, updates: list[Update]) -> Update:
    """The mean of ``updates``, each normalised per tensor first (as the aggregation normalises them), at their mean
    norm, compressed again."""
    dense = [codec.decompress(u) for u in updates]
    out = {}
    for n in codec.shapes:
        norms = [d[n].norm().clamp_min(1e-12) for d in dense]
        out[n] = sum(d[n] / norm for d, norm in zip(dense, norms, strict=True)) / len(dense) * (sum(norms) / len(norms))
    return codec.compress(out, window)


def replay(codec: Codec, window: int, previous: dict[str, torch.Tensor] | None) -> Update | None:
    """An aggregate Δ, compressed as the replayer's own update."""
    if previous is None:
        return None
    return codec.compress({n: previous[n].detach().float().cpu() for n in codec.shapes}, window)
