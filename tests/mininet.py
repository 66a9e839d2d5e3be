"""A tiny network of scripted miners around one validator model, for the scoring tests."""
from __future__ import annotations

import hashlib

import torch

from dso.codec.demo import DeMoCodec, ErrorFeedback
from dso.data.dataset import Dataset
from dso.nn.model import build_model, parameter_shapes, sync_sample_count
from dso.protocol.payload import Payload, PayloadMeta
from dso.training.train import compute_gradients, learning_rate
from scoring.sync import sample_parameters, sync_positions


def chain_randomness(window: int) -> bytes:
    return hashlib.sha256(f"test-chain-window-{window}".encode()).digest()


def eval_seed(window: int) -> bytes:
    """The chain randomness of a block after the window's uploads closed (draws F_t and S_t)."""
    return hashlib.sha256(f"test-chain-eval-{window}".encode()).digest()


class MiniNet:
    """Miners with scripted behaviours, all holding the validator's θ (they are in sync by construction).

    Behaviours: honest (DeMo on its assigned data), zeros, anti (DeMo on the *negated* gradient of its
    assigned data), noise (random values), stale (honest update, sync samples from θ + 5α)."""

    def __init__(self, hp, dataset: Dataset, behaviours: dict[int, str]):
        self.hp, self.dataset, self.behaviours = hp, dataset, dict(behaviours)
        self.model = build_model(hp.model, hp.seed)
        self.shapes = parameter_shapes(self.model)
        self.codec = DeMoCodec.from_hparams(self.shapes, hp)
        self.feedback = {uid: ErrorFeedback(self.codec, hp.ef_beta) for uid in behaviours}

    def payloads(self, window: int) -> dict[int, Payload]:
        positions = sync_positions(chain_randomness(window), self.shapes, sync_sample_count(self.hp))
        named = dict(self.model.named_parameters())
        in_sync = sample_parameters(named, positions)
        out = {}
        for uid, behaviour in sorted(self.behaviours.items()):
            batch = self.dataset.training_batch(uid, window, self.hp.assigned_sequences, self.hp.batch_size)
            sync = in_sync.clone()
            if behaviour in ("honest", "stale", "anti"):
                grads, _ = compute_gradients(self.model, batch, self.hp.micro_batch)
                if behaviour == "anti":
                    grads = {n: -g for n, g in grads.items()}
                update = self.feedback[uid].step(grads, window, uid)
                if behaviour == "stale":
                    sync = sync + 5 * learning_rate(self.hp, window)
            elif behaviour == "zeros":
                update = self.codec.compress({n: torch.zeros(s) for n, s in self.shapes.items()}, window)
            elif behaviour == "noise":
                gen = torch.Generator().manual_seed(uid * 100003 + window)
                update = self.codec.compress({n: torch.randn(s, generator=gen) for n, s in self.shapes.items()}, window)
            else:
                raise ValueError(behaviour)
            meta = PayloadMeta(uid, window, self.hp.protocol_version, self.hp.digest(), trained=self.hp.batch_size)
            out[uid] = Payload(meta, update, sync, 0)
        return out

    @torch.no_grad()
    def apply_aggregate(self, window: int, top_g: list[int], payloads: dict[int, Payload]) -> None:
        """θ ← θ − α·sign(Σ decoded updates of the top-G) (a stand-in for the real aggregation)."""
        chosen = [payloads[uid].update for uid in top_g if uid in payloads]
        if not chosen:
            return
        total = {n: torch.zeros(s) for n, s in self.shapes.items()}
        for update in chosen:
            for n, d in self.codec.decompress(update).items():
                total[n] += d
        lr = learning_rate(self.hp, window)
        for n, p in self.model.named_parameters():
            p.sub_(torch.sign(total[n]), alpha=lr)
