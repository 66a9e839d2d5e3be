"""One configuration object for every process, with documented defaults.

Sources, later ones win: dataclass defaults < a JSON/TOML file (``--config``) <
Bittensor-style dotted CLI flags (``--netuid 3``, ``--hparams.topk 16``,
``--wallet.name alice``).  Unknown keys and values of the wrong type are
rejected with a :class:`ConfigError` naming the key.

``Config.hparams`` is the part every node of one run must agree on (its hash is
checked across nodes); the other sections are local to a node (:mod:`dso.config.node`).

This module is what a config holds and how it validates; reading one from those
sources (``parse_args``, ``from_dict``, ``load_file``, ``set_key``) is :mod:`dso.config.sources`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from dso.config.fields import ConfigError as ConfigError
from dso.config.fields import doc as _doc
from dso.config.fields import expand as expand
from dso.config.fields import positive as _positive
from dso.config.node import WEIGHTS_VERSION as WEIGHTS_VERSION
from dso.config.node import DataConfig as DataConfig
from dso.config.node import NeuronConfig as NeuronConfig
from dso.config.node import StorageConfig as StorageConfig
from dso.config.node import SubtensorConfig as SubtensorConfig
from dso.config.node import WalletConfig as WalletConfig
from dso.nn import presets

# how the help gate reads a peer's help ratios (scoring.help_gate.HELP_GATES has one class per name)
HelpRule = Literal["best_of_two", "mean_of_record"]
PayRule = Literal["work", "peerscore"]
# the outer rules (dso.training.outer_rules.OUTER_RULES has one class per name; it refuses to load if they differ)
OuterRuleName = Literal["signed", "sgd", "nesterov"]


# ----------------------------------------------------------------- hparams
@dataclass
class ModelConfig:
    # first field: a preset is applied before the shape keys, which then override it
    preset: str = _doc("named shape applied before the other model keys (which override it): "
                       + presets.describe() + "; empty = the keys as given", default="")
    vocab_size: int = _doc("token vocabulary: the tokeniser's size (256 for bytes; docs/data.md)", default=4096)
    d_model: int = _doc("hidden size", default=256)
    n_layers: int = _doc("decoder blocks", default=4)
    n_heads: int = _doc("attention heads (d_model must divide)", default=4)
    ffn_hidden: int = _doc("SwiGLU hidden size", default=704)
    seq_len: int = _doc("tokens per training sequence", default=128)
    rope_theta: float = _doc("rotary base frequency", default=10000.0)
    norm_eps: float = _doc("RMSNorm epsilon", default=1e-5)
    init_std: float = _doc("std of the N(0, s) init of embeddings and linears", default=0.02)

    def validate(self, prefix: str) -> None:
        _positive(self, prefix, "vocab_size", "d_model", "n_layers", "n_heads", "ffn_hidden", "seq_len")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ConfigError(f"{prefix}.n_heads: d_model={self.d_model} must split into heads of even size")
        if self.preset and self.preset not in presets.PRESETS:
            raise ConfigError(f"{prefix}.preset: must be one of {', '.join(presets.PRESETS)}; got {self.preset!r}")

    def apply_preset(self) -> None:
        """Set the shape keys from ``preset`` (keys set after this override them)."""
        if self.preset in presets.PRESETS:
            for key, value in presets.PRESETS[self.preset].items():
                setattr(self, key, value)


@dataclass
class DPConfig:
    enabled: bool = _doc("clip + Gaussian noise on each miner update (ZIP-400 §2)", default=False)
    clip_norm: float = _doc("L2 clip of the update before noise", default=1.0)
    noise_multiplier: float = _doc("Gaussian noise std = noise_multiplier * clip_norm", default=1.0)
    delta: float = _doc("target delta of the (epsilon, delta) guarantee", default=1e-6)
    epsilon_budget: float = _doc("a miner stops uploading before spending more than this", default=10.0)
    max_order: int = _doc("Renyi orders 2..max_order are tracked", default=127)
    # --- noise derived from a privacy target: the ε that target_rounds uploads may spend
    target_epsilon: float = _doc("if > 0: the noise multiplier is derived so that target_rounds uploads spend "
                                 "exactly this epsilon at delta, and it is the budget (noise_multiplier and "
                                 "epsilon_budget are then not used); 0 = use those two", default=8.0)
    target_rounds: int = _doc("uploads the target_epsilon is spread over", default=100)

    def validate(self, prefix: str) -> None:
        _positive(self, prefix, "clip_norm", "noise_multiplier", "epsilon_budget")
        if not 0 < self.delta < 1:
            raise ConfigError(f"{prefix}.delta: must be in (0, 1), got {self.delta}")
        if self.max_order < 2:
            raise ConfigError(f"{prefix}.max_order: must be >= 2")
        if self.target_epsilon < 0 or self.target_rounds < 1:
            raise ConfigError(f"{prefix}.target_epsilon must be >= 0 and {prefix}.target_rounds >= 1")
        if self.target_epsilon > 0:  # z is derived where it is used (dso.privacy.dp.dp_settings); solvable?
            from dso.privacy.rdp import noise_for_target
            try:
                noise_for_target(self.target_epsilon, self.delta, self.target_rounds, range(2, self.max_order + 1))
            except ValueError as e:
                raise ConfigError(f"{prefix}.target_epsilon: {e}") from None


@dataclass
class InnerConfig:
    """A miner's inner loop within a window (dso/training/inner.py, docs/training.md)."""

    mode: Literal["steps", "gradient"] = _doc(
        "steps: up to steps_max optimiser steps, pseudo-gradient = theta_t - theta_local; gradient: the "
        "paper's mode, one gradient per window sent as the update", default="steps")
    steps_max: int = _doc("H_max: protocol maximum of inner steps per window (each on the next batch_size "
                          "assigned sequences; assigned_sequences should be >= steps_max * batch_size; 32: one "
                          "idle CPU core fills a 24 s window, docs/training.md)", default=32)
    optimizer: Literal["adamw", "sgd"] = _doc("inner optimiser (sgd uses momentum beta1)", default="adamw")
    lr: float = _doc("peak inner learning rate", default=2e-3)
    beta1: float = _doc("AdamW beta1 / SGD momentum", default=0.9)
    beta2: float = _doc("AdamW beta2", default=0.95)
    eps: float = _doc("AdamW epsilon", default=1e-8)
    weight_decay: float = _doc("decoupled weight decay of the inner optimiser", default=0.0)
    warmup_steps: int = _doc("linear warm-up over the miner's first inner steps (counted across windows)",
                             default=10)
    schedule: Literal["constant", "cosine"] = _doc("inner lr after warm-up, by window", default="constant")
    decay_windows: int = _doc("cosine: windows from peak to min_lr_ratio (then held)", default=100)
    min_lr_ratio: float = _doc("cosine: final lr as a share of the peak", default=0.1)
    clip_norm: float = _doc("clip each inner gradient to this L2 norm; 0 = off", default=1.0)
    persist_state: bool = _doc("keep the optimiser state (moments) across windows instead of resetting it",
                               default=True)

    def validate(self, prefix: str) -> None:
        _positive(self, prefix, "steps_max", "lr", "eps", "decay_windows")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{prefix}.{name}: must be in [0, 1), got {getattr(self, name)}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"{prefix}.min_lr_ratio: must be in [0, 1], got {self.min_lr_ratio}")
        if self.weight_decay < 0 or self.warmup_steps < 0 or self.clip_norm < 0:
            raise ConfigError(f"{prefix}: weight_decay, warmup_steps and clip_norm must be >= 0")


@dataclass
class OuterConfig:
    """The network's outer step on the aggregate (dso/training/outer.py, docs/training.md)."""

    rule: OuterRuleName = _doc(
        "signed: Gauntlet theta -= alpha*sign(mean), alpha = learning_rate; sgd / nesterov: theta -= lr * "
        "(decoded mean, each peer rescaled to the median norm), nesterov with momentum (DiLoCo's outer step; "
        "measured worse at this scale, docs/decisions/0042)", default="sgd")
    lr: float = _doc("outer learning rate of the sgd and nesterov rules (2 with the DCT codec; docs/training.md, "
                     "eleventh pass)", default=2.5)
    momentum: float = _doc("nesterov: momentum of the outer optimiser", default=0.9)

    def validate(self, prefix: str) -> None:
        _positive(self, prefix, "lr")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"{prefix}.momentum: must be in [0, 1), got {self.momentum}")


HELP_MEMORY_MAX = 64  # the longest help record a run may keep (scoring/state.py refuses longer ones)


@dataclass
class HParams:
    """Protocol hyper-parameters: identical on every node of a run."""

    protocol_version: int = _doc("object keys and payloads carry it", default=1)
    seed: int = _doc("run seed: model init and data assignment", default=1234)
    data_hash: str = _doc("sha256 of tokenizer + token ids; empty = not pinned", default="")
    model: ModelConfig = field(default_factory=ModelConfig)
    # --- training
    batch_size: int = _doc("sequences a baseline miner trains on per window (from its assignment)", default=16)
    assigned_sequences: int = _doc("sequences assigned to a peer per window: enough for inner.steps_max steps of "
                                   "batch_size (the fastest miner the protocol allows); a faster or more diligent "
                                   "miner gets further into them", default=512)
    micro_batch: int = _doc("sequences per forward/backward (gradient accumulation)", default=8)
    learning_rate: float = _doc("alpha: size of the signed step", default=2e-3)
    warmup_windows: int = _doc("linear warm-up of alpha over this many windows", default=5)
    weight_decay: float = _doc("decoupled weight decay applied with the signed step", default=0.0)
    val_fraction: float = _doc("share of sequences held out for validation", default=0.02)
    val_sequences: int = _doc("validation sequences used per loss measurement", default=32)
    # --- codec
    codec: Literal["demo", "sketch"] = _doc("update codec", default="demo")
    chunk: int = _doc("codec chunk edge (largest divisor <= this, see docs/codec.md)", default=64)
    topk: int = _doc("coefficients kept per chunk (where embed_topk, attn_topk or ffn_topk does not say "
                     "otherwise: the norms' gains)", default=24)
    embed_topk: int = _doc("coefficients kept per chunk of the token embedding (tied with the output head: what "
                           "compression costs most; docs/training.md \"Seventh pass\"); 0 = topk", default=56)
    attn_topk: int = _doc("coefficients kept per chunk of the blocks' attention matrices; 0 = topk "
                          "(docs/training.md \"Eighth pass\")", default=16)
    ffn_topk: int = _doc("coefficients kept per chunk of the blocks' feed-forward matrices; 0 = topk "
                         "(docs/training.md \"Eighth pass\")", default=28)
    ef_beta: float = _doc("error-feedback decay beta", default=0.9)
    value_bits: int = _doc("bits per kept value: 2..8 (sign + level, levels decoded at their members' mean; "
                           "docs/codec.md) or 32 (float32)", default=2)
    sketch_dim: int = _doc("sketch codec: projected dimension per tensor (cap)", default=4096)
    sketch_clip: float = _doc("sketch codec: L2 clip before projection", default=1.0)
    # --- windows
    blocks_per_window: int = _doc("chain blocks per training window (24: a window's fixed costs, encoding, upload "
                                  "and the aggregate, are ~1/8 of it on the local network, docs/training.md)",
                                  default=24)
    put_window_seconds: float = _doc("length of the upload window after a window ends", default=3.0)
    # --- Gauntlet scoring
    eval_scale: float = _doc("c in beta_eval = c * alpha", default=0.2)
    poc_gamma: float = _doc("gamma of the EMA mu of proof-of-computation verdicts (+1 pass, -1 fail)", default=0.95)
    fast_penalty: float = _doc("phi applied to mu on a failed fast check", default=0.75)
    sync_threshold: float = _doc("SyncScore above this (in signed steps) fails", default=3.0)
    sync_samples: int = _doc("SyncScore samples per payload, at least (see sync_samples_per_tensor)", default=64)
    eval_peers: int = _doc("|S_t|: peers given the primary evaluation per window", default=6)
    fast_peers: int = _doc("|F_t|: peers given fast checks per window (top-G always in)", default=32)
    eval_sequences: int = _doc("sequences of D_rand per window: LossScore's and the proof of computation's random "
                               "side (docs/scoring.md)", default=32)
    poc_sequences: int = _doc("proof of computation: the fewest of the sequences a peer declared it trained on that "
                              "one evaluation tests (docs/scoring.md, 'Proof of computation')", default=32)
    poc_fraction: float = _doc("proof of computation: the share of the declared sequences one evaluation tests, when "
                               "more than poc_sequences", default=0.25)
    poc_threshold: float = _doc("proof of computation: a peer is paid while the mean of its last poc_memory test "
                                "statistics (Welch's t of its per-sequence loss gains over the consensus step, trained "
                                "against random sequences) is at least this", default=1.5)
    poc_memory: int = _doc("proof of computation: the tests a peer's record keeps (at least 2 before it is paid)",
                           default=4)
    poc_cooldown: int = _doc("windows a peer is not paid after it uploaded a replay or an empty update (a part-time "
                             "miner sends them in the windows it does not train)", default=10)
    topg: int = _doc("G: peers aggregated per window", default=15)
    weight_power: float = _doc("c of the power normalisation of scores (1: pay follows the rating; 0.7 with the "
                               "DCT codec, whose rating already rewards quality steeply; docs/scoring.md)",
                               default=1.0)
    pay_rule: PayRule = _doc(
        "what a paid peer's weight follows: 'work', the sequences it proved it trained times the quality of its "
        "updates, behind the proof-of-computation, help and copy gates (docs/scoring.md); 'peerscore', the Gauntlet "
        "paper's PeerScore = PoC mu x LossRating behind the same cuts (the gauntlet profile, with weight_power 2)",
        default="work")
    windows_per_weights: int = _doc("post weights every this many windows", default=1)
    checkpoint_every: int = _doc("validator checkpoints every this many windows", default=5)
    # --- DSO extensions
    aggregation: Literal["mean", "krum", "median", "trimmed_mean", "geomedian"] = _doc(
        "rule applied before the sign", default="mean")
    krum_f: int = _doc("Multi-Krum: assumed Byzantine peers f", default=1)
    krum_m: int = _doc("Multi-Krum: updates averaged (0 = n - f)", default=0)
    trim_beta: float = _doc("trimmed mean: share trimmed per side", default=0.1)
    coherence_threshold: float = _doc("cosine to the consensus below this is dropped; -1 = off", default=-1.0)
    commit_reveal: bool = _doc("upload a hash in the put window, reveal in the next", default=False)
    dp: DPConfig = field(default_factory=DPConfig)
    # --- tokeniser (docs/data.md)
    tokenizer: Literal["bytes", "bpe"] = _doc(
        "bytes: 256 ids, id = byte value (vocab_size must be 256); bpe: byte-level BPE with "
        "hparams.model.vocab_size ids, trained from the corpus on first use (or data.tokenizer_file); "
        "bpe with 4096 ids is the default: lowest bits per byte at equal compute (docs/data.md)",
        default="bpe")
    # --- evaluation nobody can predict, SyncScore on every tensor
    eval_max_gap_factor: float = _doc("a passing peer waits at most ceil(factor * passing peers / "
                                      "|S_t|) windows between evaluations (the same for fast checks)", default=2.0)
    sync_samples_per_tensor: int = _doc("SyncScore samples per parameter tensor, so every tensor is checked each "
                                        "window at any model size; sync_samples is the floor of the total",
                                        default=1)
    # --- fair, stable weights (docs/scoring.md, "Fair, stable weights")
    rating_beta: float = _doc("OpenSkill Plackett-Luce beta: the spread of one match's result around a peer's "
                              "skill (larger = each match moves the rating less)", default=25 / 6)
    rating_tau: float = _doc("OpenSkill tau: added to sigma before every match, so the rating keeps "
                             "learning (larger = shorter horizon, faster reaction, noisier)", default=25 / 300)
    rating_z: float = _doc("LossRating = rating mu - z * sigma (a lower confidence bound; 3 is the library's "
                           "ordinal; 0.5 keeps honest peers' ratings well above 0 — docs/scoring.md)", default=0.5)
    poc_floor: float = _doc("proof of computation as a pass/fail gate: a peer is paid (PeerScore = LossRating) only "
                            "once evaluated and while its PoC mu >= this; below it PeerScore = min(LossRating, 0). "
                            "Negative: honest mu wanders around 0 on current training, a no-work peer sinks "
                            "(docs/scoring.md)", default=-0.25)
    help_share: float = _doc("help gate: a peer is not paid while its last two LossScores over their windows' "
                             "medians fall below this (help_rule says how; 0.2 with best_of_two; docs/scoring.md)",
                             default=0.3)
    help_rule: HelpRule = _doc(
        "help gate: mean_of_record cuts when the lower of two means is below help_share, the last two ratios' (a "
        "no-work evaluation counted 0) and the whole record's (help_memory ratios, no work counted -1): a noise "
        "update needs a run of lucky draws; best_of_two cuts only when both of the last two are below (the DCT "
        "codec's noisier honest scores need it; docs/scoring.md)",
        default="mean_of_record")
    help_memory: int = _doc("help gate: the evaluations a peer's help record keeps; it is not paid while 2 of them "
                            "did not lower the loss (docs/scoring.md)", default=3)
    weight_smoothing: float = _doc("posted weights = s * this window's + (1 - s) * the last posted, for peers "
                                   "still paid this window (others drop to 0 at once); 1 = no smoothing",
                                   default=0.5)
    # --- codec domain, inner loop, outer step (docs/codec.md, docs/training.md)
    dct: bool = _doc("codec: DCT each chunk before top-k (DeMo's; configs/dct.toml sets it with the values measured "
                     "for it); false = top-k of raw parameter chunks (Templar's current codec; docs/codec.md)",
                     default=False)
    inner: InnerConfig = field(default_factory=InnerConfig)
    outer: OuterConfig = field(default_factory=OuterConfig)

    def validate(self, prefix: str) -> None:
        self.model.validate(f"{prefix}.model")
        if self.tokenizer == "bytes" and self.model.vocab_size != 256:
            raise ConfigError(f"{prefix}.model.vocab_size: the byte tokeniser has 256 ids, got "
                              f"{self.model.vocab_size} (set it to 256, or {prefix}.tokenizer=bpe)")
        if self.tokenizer == "bpe" and not 256 < self.model.vocab_size <= 1 << 32:
            raise ConfigError(f"{prefix}.model.vocab_size: a BPE needs more than the 256 byte ids (and at most "
                              f"2^32), got {self.model.vocab_size}")
        self.dp.validate(f"{prefix}.dp")
        self.inner.validate(f"{prefix}.inner")
        self.outer.validate(f"{prefix}.outer")
        if self.inner.mode == "steps" and self.assigned_sequences < self.inner.steps_max * self.batch_size:
            raise ConfigError(f"{prefix}.assigned_sequences: {self.assigned_sequences} is fewer than "
                              f"inner.steps_max × batch_size = {self.inner.steps_max * self.batch_size}: the "
                              "fastest miner the protocol allows would run out of assigned data")
        _positive(self, prefix, "batch_size", "micro_batch", "learning_rate", "val_sequences", "chunk",
                  "topk", "blocks_per_window", "put_window_seconds", "sync_samples", "eval_peers",
                  "fast_peers", "eval_sequences", "poc_sequences", "poc_threshold", "topg", "weight_power",
                  "windows_per_weights",
                  "checkpoint_every", "sketch_dim", "sketch_clip", "protocol_version")
        if self.assigned_sequences < self.batch_size:
            raise ConfigError(f"{prefix}.assigned_sequences: must be >= batch_size ({self.batch_size})")
        for name in ("topk", "embed_topk", "attn_topk", "ffn_topk"):
            if not 0 <= getattr(self, name) <= self.chunk * self.chunk:
                raise ConfigError(f"{prefix}.{name}: {getattr(self, name)} is not in [0, {self.chunk * self.chunk}], "
                                  f"the coefficients of a {self.chunk}x{self.chunk} chunk")
        if self.value_bits not in (*range(2, 9), 32):
            raise ConfigError(f"{prefix}.value_bits: must be 2..8 or 32, got {self.value_bits}")
        for name in ("ef_beta", "poc_gamma", "fast_penalty", "val_fraction"):
            v = getattr(self, name)
            if not 0 <= v < 1 or (name == "val_fraction" and v == 0):
                raise ConfigError(f"{prefix}.{name}: must be in [0, 1), got {v}")
        if not 0 <= self.trim_beta < 0.5:
            raise ConfigError(f"{prefix}.trim_beta: must be in [0, 0.5), got {self.trim_beta}")
        if not 0 < self.eval_scale <= 1:
            raise ConfigError(f"{prefix}.eval_scale: must be in (0, 1], got {self.eval_scale}")
        if self.krum_f < 0 or self.krum_m < 0 or self.warmup_windows < 0 or self.weight_decay < 0:
            raise ConfigError(f"{prefix}: krum_f, krum_m, warmup_windows, weight_decay must be >= 0")
        if not self.eval_max_gap_factor >= 1:
            raise ConfigError(f"{prefix}.eval_max_gap_factor: must be >= 1, got {self.eval_max_gap_factor}")
        if not (self.rating_beta > 0 and self.rating_tau >= 0 and self.rating_z >= 0):
            raise ConfigError(f"{prefix}: rating_beta must be > 0, rating_tau and rating_z >= 0")
        if not -1 < self.poc_floor <= 0 or not 0 < self.weight_smoothing <= 1 or not 0 <= self.help_share <= 1:
            raise ConfigError(f"{prefix}: poc_floor must be in (-1, 0], weight_smoothing in (0, 1], help_share in "
                              "[0, 1]")
        if not 2 <= self.help_memory <= HELP_MEMORY_MAX:
            raise ConfigError(f"{prefix}.help_memory: must be in [2, {HELP_MEMORY_MAX}]")
        if self.poc_cooldown < 0:
            raise ConfigError(f"{prefix}.poc_cooldown: must be >= 0")
        if not 2 <= self.poc_memory <= HELP_MEMORY_MAX:
            raise ConfigError(f"{prefix}.poc_memory: must be in [2, {HELP_MEMORY_MAX}]")
        if not 0 < self.poc_fraction <= 1:
            raise ConfigError(f"{prefix}.poc_fraction: must be in (0, 1], got {self.poc_fraction}")
        if self.sync_samples_per_tensor < 1:
            raise ConfigError(f"{prefix}.sync_samples_per_tensor: must be >= 1 (every tensor checked each window)")

    def digest(self) -> str:
        """Stable hash of the run's protocol settings (nodes compare it)."""
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


# ----------------------------------------------------------- node-local (dso/config/node.py)

@dataclass
class Config:
    netuid: int = _doc("subnet id", default=1)
    device: str = _doc("torch device: cpu or cuda", default="cpu")
    threads: int = _doc("torch threads (1 when several nodes share a machine)", default=1)
    wallet: WalletConfig = field(default_factory=WalletConfig)
    subtensor: SubtensorConfig = field(default_factory=SubtensorConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    data: DataConfig = field(default_factory=DataConfig)
    neuron: NeuronConfig = field(default_factory=NeuronConfig)
    hparams: HParams = field(default_factory=HParams)

    def validate(self) -> Config:
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"device: expected cpu, cuda or cuda:N, got {self.device!r}")
        _positive(self, "", "threads")
        if self.neuron.train_sequences < 0:
            raise ConfigError("neuron.train_sequences: must be >= 0")
        if self.storage.checkpoint_shard_mib < 1:
            raise ConfigError("storage.checkpoint_shard_mib: must be >= 1")
        if self.neuron.step_sequences < 0:
            raise ConfigError("neuron.step_sequences: must be >= 0")
        if self.netuid < 0:
            raise ConfigError("netuid: must be >= 0")
        if not 0 <= self.neuron.metrics_port <= 65535:
            raise ConfigError(f"neuron.metrics_port: must be 0 (off) or a TCP port 1..65535, got "
                              f"{self.neuron.metrics_port}")
        self.hparams.validate("hparams")
        if self.subtensor.weights_version < 0:
            raise ConfigError("subtensor.weights_version: must be >= 0")
        if self.data.tokenizer_file and self.hparams.tokenizer != "bpe":
            raise ConfigError("data.tokenizer_file: only used with hparams.tokenizer=bpe")
        if not 0 < self.data.cache_mb < float("inf"):
            raise ConfigError(f"data.cache_mb: must be > 0 MB, got {self.data.cache_mb}")
        if bool(self.data.access_key_id) != bool(self.data.secret_access_key):
            raise ConfigError("data.access_key_id and data.secret_access_key go together")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
