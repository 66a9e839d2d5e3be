"""A checkpoint in one safetensors file: the named parameters and the outer state, verified on loading.

The one-file form of a checkpoint (storage/checkpoint.py keeps the network's checkpoints in S3 as
sharded objects instead): what ``scripts/export_hf.py`` reads from a file, and a compact form for
tests.  The file holds every parameter
(float32, model order), the outer optimiser's state at that window
(``outer.steps`` and, for the nesterov rule, ``outer.momentum.<param>``; see
dso/training/outer.py — θ alone does not determine θ_{t+1} under a stateful outer rule)
and metadata: ``format``, ``protocol_version``, ``window``, ``model_hash``
(:func:`dso.nn.model.state_hash` of the parameters in model order), ``outer_digest``,
``data_hash``, ``hparams``.  Loading checks the container, the
exact parameter set and shapes, finiteness, the metadata, and recomputes the
hash — a single flipped byte is a Rejection, never a silently wrong model.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import safetensors.numpy
import torch

from dso.nn.model import state_hash
from dso.protocol.rejections import Reason, Rejection, unexpected
from dso.training.outer import STATE_PREFIX, OuterState
from dso.training.outer_rules import OuterRule
from storage.tensorfile import check_spec, header_allowance, load_arrays, parse_uint, read_capped

FORMAT = "dso-checkpoint"


@dataclass
class Checkpoint:
    window: int
    model_hash: str
    data_hash: str
    hparams_digest: str
    tensors: dict[str, torch.Tensor]   # model order
    outer: OuterState = field(default_factory=OuterState)

    def load_into(self, model: torch.nn.Module) -> None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(self.tensors[name].to(p.device))


def checkpoint_size_cap(shapes: dict[str, tuple[int, ...]]) -> int:
    # parameters + (nesterov) one momentum tensor per parameter + the step counter
    return 8 + header_allowance(2 * len(shapes) + 1) + 8 * sum(math.prod(s) for s in shapes.values()) + 8


def encode_checkpoint(named: Iterable[tuple[str, torch.Tensor]], window: int, protocol_version: int,
                      hparams_digest: str, data_hash: str = "", outer: OuterState | None = None) -> tuple[bytes, str]:
    """(safetensors bytes, model hash) of named tensors in the given (model) order and the outer state."""
    tensors = {n: t.detach().to("cpu", torch.float32).contiguous() for n, t in named}
    model_hash = state_hash(tensors.items())
    outer = outer or OuterState()
    metadata = {"format": FORMAT, "protocol_version": str(protocol_version), "window": str(window),
                "model_hash": model_hash, "outer_digest": outer.digest(), "data_hash": data_hash,
                "hparams": hparams_digest}
    arrays = {n: t.numpy() for n, t in tensors.items()} | {k: t.numpy() for k, t in outer.tensors().items()}
    data = safetensors.numpy.save(arrays, metadata=metadata)
    return data, model_hash


def decode_checkpoint(data: bytes, shapes: dict[str, tuple[int, ...]], protocol_version: int,
                      hparams_digest: str | None = None, expect_window: int | None = None,
                      expect_hash: str | None = None, rule: OuterRule | None = None) -> Checkpoint | Rejection:
    """Strictly validate checkpoint bytes against the model's ``shapes`` (model order); never raises.

    ``rule`` is the run's outer rule, whose state the file must hold (None: whichever it holds)."""
    try:
        return _decode(data, shapes, protocol_version, hparams_digest, expect_window, expect_hash, rule)
    except Exception as e:  # noqa: BLE001
        return unexpected(Reason.MALFORMED, e)


def _decode(data: bytes, shapes: dict[str, tuple[int, ...]], protocol_version: int, hparams_digest: str | None,
            expect_window: int | None, expect_hash: str | None, rule: OuterRule | None) -> Checkpoint | Rejection:
    header = read_capped(data, checkpoint_size_cap(shapes), 2 * len(shapes) + 1,
                         {"format", "protocol_version", "window", "model_hash", "outer_digest", "data_hash",
                          "hparams"})
    if isinstance(header, Rejection):
        return header
    md = header.metadata
    window = parse_uint(md["window"])
    checks = [("format", md["format"], FORMAT), ("protocol_version", md["protocol_version"], str(protocol_version))]
    if hparams_digest is not None:
        checks.append(("hparams", md["hparams"], hparams_digest))
    if expect_window is not None:
        checks.append(("window", md["window"], str(expect_window)))
    if expect_hash is not None:
        checks.append(("model_hash", md["model_hash"], expect_hash))
    for name, got, wanted in checks:
        if got != wanted:
            return Rejection(Reason.METADATA_MISMATCH, f"{name}: got {got[:64]!r}, expected {wanted[:64]!r}")
    if window is None:
        return Rejection(Reason.METADATA_MISMATCH, "window is not a canonical integer")
    # a reader that does not know the run's rule (None) takes whichever state the file holds
    momentum = (any(k.startswith(f"{STATE_PREFIX}momentum.") for k in header.entries) if rule is None
                else rule.keeps_momentum)
    spec = {n: ("float32", tuple(s)) for n, s in shapes.items()} | OuterState.zeros(shapes, momentum).spec()
    bad = check_spec(header, spec)
    if bad:
        return bad
    arrays = load_arrays(data)
    if isinstance(arrays, Rejection):
        return arrays
    tensors = {n: torch.from_numpy(np.array(arrays[n], dtype=np.float32)) for n in shapes}
    for n, t in tensors.items():
        if not bool(torch.isfinite(t).all()):
            return Rejection(Reason.NON_FINITE, f"{n}: non-finite parameter")
    actual = state_hash(tensors.items())
    if actual != md["model_hash"]:
        return Rejection(Reason.METADATA_MISMATCH,
                         f"model hash mismatch: content {actual[:16]}…, metadata {md['model_hash'][:16]}…")
    outer = OuterState.from_tensors({k: torch.from_numpy(np.array(arrays[k])) for k in arrays
                                     if k.startswith(STATE_PREFIX)}, shapes, rule)
    if outer is None:
        return Rejection(Reason.NON_FINITE, "outer state: negative step count or non-finite momentum")
    if outer.digest() != md["outer_digest"]:
        return Rejection(Reason.METADATA_MISMATCH, "outer state hash mismatch: content does not match outer_digest")
    return Checkpoint(window, actual, md["data_hash"], md["hparams"], tensors, outer)
