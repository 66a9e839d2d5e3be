"""The project's model as a Hugging Face ``transformers`` Llama checkpoint (config, weights, tokeniser).

dso's decoder *is* a Llama (RMSNorm, rotary positions, SwiGLU, no biases, tied embeddings); only
names and one layout differ:

* rotary pairing: dso rotates interleaved pairs (2i, 2i+1) of each head, HF Llama rotates halves
  (i, i + head_dim/2).  Permuting the rows of ``wq`` and ``wk`` inside each head (even rows first,
  then odd rows) turns one into the other; q·k is unchanged because both get the same permutation,
  and ``wv``/``wo`` are untouched.
* names: ``embed`` → ``model.embed_tokens``, ``blocks.i.attn.wq`` → ``model.layers.i.self_attn.q_proj``,
  ``ffn.w_gate/w_up/w_down`` → ``mlp.gate_proj/up_proj/down_proj``, ``attn_norm``/``ffn_norm`` →
  ``input_layernorm``/``post_attention_layernorm``, ``norm`` → ``model.norm``; the output head is the
  tied embedding (``tie_word_embeddings``), so no ``lm_head.weight`` is written.

The tokeniser ships as ``tokenizer.json`` (the byte tokeniser as an equivalent merge-free byte-level
BPE) with a ``tokenizer_config.json`` naming ``PreTrainedTokenizerFast``.  There are no special tokens,
so generation runs to ``max_new_tokens``.  This module needs only torch and safetensors.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from dso.config.schema import ModelConfig
from dso.data.tokenizer import Tokenizer

_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight",
    "attn.wk.weight": "self_attn.k_proj.weight",
    "attn.wv.weight": "self_attn.v_proj.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn.w_gate.weight": "mlp.gate_proj.weight",
    "ffn.w_up.weight": "mlp.up_proj.weight",
    "ffn.w_down.weight": "mlp.down_proj.weight",
}


def interleaved_to_halves(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of a q/k projection reordered per head from (0, 1, 2, 3, …) pairs to (0, 2, …, 1, 3, …)."""
    out_dim, in_dim = weight.shape
    head_dim = out_dim // n_heads
    return weight.reshape(n_heads, head_dim // 2, 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def hf_state_dict(tensors: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """dso parameter names and layout → HF Llama's (float32, contiguous)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        t = t.detach().to("cpu", torch.float32)
        if name == "embed.weight":
            out["model.embed_tokens.weight"] = t
        elif name == "norm.weight":
            out["model.norm.weight"] = t
        elif name.startswith("blocks."):
            _, layer, rest = name.split(".", 2)
            if rest not in _BLOCK_NAMES:
                raise ValueError(f"unexpected parameter {name}")
            if rest in ("attn.wq.weight", "attn.wk.weight"):
                t = interleaved_to_halves(t, cfg.n_heads)
            out[f"model.layers.{int(layer)}.{_BLOCK_NAMES[rest]}"] = t
        else:
            raise ValueError(f"unexpected parameter {name}")
    return {k: v.contiguous() for k, v in out.items()}


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    """A ``LlamaConfig`` as JSON (keys for transformers 4.x and 5.x alike)."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "intermediate_size": cfg.ffn_hidden,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_heads,
        "head_dim": cfg.d_model // cfg.n_heads, "hidden_act": "silu", "max_position_embeddings": cfg.seq_len,
        "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "initializer_range": cfg.init_std, "tie_word_embeddings": True, "attention_bias": False,
        "mlp_bias": False, "attention_dropout": 0.0, "pretraining_tp": 1, "use_cache": True,
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "torch_dtype": "float32",
    }


def write_export(out_dir: str | Path, tensors: dict[str, torch.Tensor], cfg: ModelConfig, tokenizer: Tokenizer,
                 provenance: dict[str, Any] | None = None) -> Path:
    """Write a folder ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained`` load."""
    if tokenizer.vocab_size != cfg.vocab_size:
        raise ValueError(f"tokeniser has {tokenizer.vocab_size} ids, the model {cfg.vocab_size}")
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    state = hf_state_dict(tensors, cfg)
    safetensors.torch.save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out / "config.json", hf_config(cfg))
    _write_json(out / "generation_config.json", {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None})
    (out / "tokenizer.json").write_text(tokenizer.to_json(), encoding="utf-8")
    _write_json(out / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast",
                                                "model_max_length": cfg.seq_len,
                                                "clean_up_tokenization_spaces": False})
    if provenance:
        _write_json(out / "dso_provenance.json", provenance)
    return out


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
