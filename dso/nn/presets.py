"""Named model shapes (``--hparams.model.preset NAME``) and the parameter count of a shape.

A preset sets width, depth, heads and SwiGLU width; the vocabulary (the tokeniser's) and the
sequence length stay separate keys, and any key given explicitly after the preset overrides it.
Names give the size without the embedding table (whose size depends on the tokeniser): the
embedding adds ``vocab_size · d_model`` (tied with the output head).
"""
from __future__ import annotations

PRESETS: dict[str, dict[str, int]] = {
    # the default: about 3.2 M parameters, trains on 2 CPU cores
    "tiny": {"d_model": 256, "n_layers": 4, "n_heads": 4, "ffn_hidden": 704},
    # heads of 64 from here on; SwiGLU width ≈ 8/3 · d_model, rounded to a multiple of 64
    "25m": {"d_model": 512, "n_layers": 8, "n_heads": 8, "ffn_hidden": 1408},
    "125m": {"d_model": 768, "n_layers": 18, "n_heads": 12, "ffn_hidden": 2048},
    "1b": {"d_model": 2048, "n_layers": 20, "n_heads": 16, "ffn_hidden": 5632},
}


def non_embedding_parameters(d_model: int, n_layers: int, ffn_hidden: int, **_: int) -> int:
    """Per block: four d×d attention projections, three SwiGLU matrices, two RMSNorm gains; plus the final norm."""
    return n_layers * (4 * d_model * d_model + 3 * d_model * ffn_hidden + 2 * d_model) + d_model


def total_parameters(d_model: int, n_layers: int, ffn_hidden: int, vocab_size: int, **_: int) -> int:
    return non_embedding_parameters(d_model, n_layers, ffn_hidden) + vocab_size * d_model


def describe() -> str:
    """One line per preset for ``--help``."""
    return "; ".join(f"{name} = d_model {p['d_model']}, {p['n_layers']} layers, {p['n_heads']} heads, ffn "
                     f"{p['ffn_hidden']} ({non_embedding_parameters(**p) / 1e6:.1f} M without the embedding)"
                     for name, p in PRESETS.items())
