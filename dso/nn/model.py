"""A small LLaMA-style decoder: RMSNorm, rotary positions, SwiGLU, tied embeddings.

Every node builds the same initial weights from the run seed (initialisation
runs on the CPU with a seeded generator, then moves to the device), so θ_0 is
identical network-wide.  :func:`model_hash` fingerprints the parameters for
sync checks, checkpoints and the provenance ledger.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from dso.config.schema import HParams, ModelConfig

EMBEDDING = "embed.weight"  # the tied embedding's parameter name (the codec gives it its own top-k)


def parameter_kind(name: str) -> str:
    """What a parameter is, for the codec's per-kind top-k: ``embed`` (the tied embedding and output head),
    ``attn`` / ``ffn`` (a block's attention or feed-forward matrices), or ``other`` (the norms' gains)."""
    if name == EMBEDDING:
        return "embed"
    parts = name.split(".")  # blocks.<i>.<part>.<matrix>.weight
    is_block_matrix = len(parts) > 2 and parts[0] == "blocks" and parts[2] in ("attn", "ffn")
    return parts[2] if is_block_matrix else "other"


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_tables(head_dim: int, seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (even, odd) of the last dim; x is (batch, heads, seq, head_dim)."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.wq = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wo = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        split: Callable[[torch.Tensor], torch.Tensor] = (  # noqa: E731
            lambda y: y.view(b, t, self.n_heads, self.head_dim).transpose(1, 2))
        q = apply_rotary(split(self.wq(x)), cos, sin)
        k = apply_rotary(split(self.wk(x)), cos, sin)
        v = split(self.wv(x))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: torch.Tensor = self.wo(y.transpose(1, 2).reshape(b, t, d))
        return out


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w_gate = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.w_up = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.w_down = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))
        return out


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ffn = SwiGLU(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        out: torch.Tensor = x + self.ffn(self.ffn_norm(x))
        return out


class Decoder(nn.Module):
    rope_cos: torch.Tensor  # buffers (register_buffer below)
    rope_sin: torch.Tensor

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        # recompute each block's activations in the backward pass instead of keeping them (a node setting:
        # memory for compute, the same numbers; docs/scale.md)
        self.activation_checkpointing = False
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        cos, sin = rotary_tables(cfg.d_model // cfg.n_heads, cfg.seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.cfg.seq_len:
            raise ValueError(f"sequence of {t} tokens exceeds seq_len={self.cfg.seq_len}")
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        x = self.embed(tokens)
        recompute = self.activation_checkpointing and torch.is_grad_enabled()
        for block in self.blocks:
            x = checkpoint(block, x, cos, sin, use_reentrant=False) if recompute else block(x, cos, sin)
        logits: torch.Tensor = self.norm(x) @ self.embed.weight.T  # tied output head
        return logits

    def reset_rotary(self) -> None:
        """Recompute the rotary tables (after the model was built on the meta device and given memory)."""
        cos, sin = rotary_tables(self.cfg.d_model // self.cfg.n_heads, self.cfg.seq_len, self.cfg.rope_theta)
        with torch.no_grad():
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of a (n, seq_len + 1) batch of ids."""
        logits = self(batch[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))

    def sequence_losses(self, batch: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of each sequence of a (n, seq_len + 1) batch of ids: shape (n,)."""
        logits = self(batch[:, :-1])                                           # (n, seq_len, vocab)
        tokens = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1),
                                 reduction="none")                             # (n · seq_len,)
        return tokens.view(batch.shape[0], -1).mean(dim=1)                     # (n,)


def build_model(cfg: ModelConfig, seed: int, device: str | torch.device = "cpu") -> Decoder:
    """The run's θ_0: same seed, same weights on every node and device."""
    model = Decoder(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            _initialise(cfg, name, p, gen)
    return model.to(device)


def initial_tensors(cfg: ModelConfig, seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    """The run's θ_0 one tensor at a time, in :func:`build_model`'s order and with its values, without a whole
    model in memory (a node on ranks scatters each tensor and drops it: dso/distributed/sliced_theta.py)."""
    with torch.device("meta"):
        shapes = parameter_shapes(Decoder(cfg))
    gen = torch.Generator().manual_seed(seed)
    for name, shape in shapes.items():
        tensor = torch.empty(shape, dtype=torch.float32)
        _initialise(cfg, name, tensor, gen)
        yield name, tensor


def _initialise(cfg: ModelConfig, name: str, p: torch.Tensor, gen: torch.Generator) -> None:
    resid_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)  # GPT-2 style scaling of residual outputs
    if name.endswith("norm.weight"):
        p.fill_(1.0)
    elif name.endswith(("attn.wo.weight", "ffn.w_down.weight")):
        p.normal_(0.0, resid_std, generator=gen)
    else:
        p.normal_(0.0, cfg.init_std, generator=gen)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def state_hash(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over (name, shape, float32 bytes) of named tensors, in the given order."""
    h = hashlib.sha256()
    for name, p in named:
        h.update(name.encode())
        h.update(str(tuple(p.shape)).encode())
        h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def model_hash(model: nn.Module) -> str:
    """Fingerprint of every parameter (named_parameters order: fixed by the architecture)."""
    return state_hash(model.named_parameters())


def parameter_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


@functools.lru_cache(maxsize=32)
def _tensor_count(cfg_fields: tuple[Any, ...]) -> int:
    # The same architecture with every width shrunk to a few units: the same tensors, built in microseconds
    # (the meta device would do it without memory, but its first use imports torch's compiler: seconds).
    small = dataclasses.replace(ModelConfig(*cfg_fields), vocab_size=1, d_model=2, n_heads=1, ffn_hidden=1,
                                seq_len=1)
    return sum(1 for _ in Decoder(small).parameters())


def tensor_count(cfg: ModelConfig) -> int:
    """Number of parameter tensors of the model ``cfg`` describes (cached)."""
    return _tensor_count(dataclasses.astuple(cfg))


def sync_sample_count(hp: HParams) -> int:
    """Length of every payload's SyncScore vector: ``hp.sync_samples_per_tensor`` samples for each parameter
    tensor, and never fewer than ``hp.sync_samples`` in total (design §6.2, docs/scoring.md).  Miners, validators
    and the wire format's strict checks all take the length from here."""
    return max(int(hp.sync_samples), int(hp.sync_samples_per_tensor) * tensor_count(hp.model))
