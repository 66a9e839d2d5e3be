"""The small network the end-to-end tests run, as hyper-parameters, for the tests and the scripts that study it."""
from __future__ import annotations

from dso.config.schema import HParams, ModelConfig


def small_network_hparams() -> HParams:
    """A small model and 4-second windows (with ``block_time=0.5``): a fresh object each call."""
    # a BPE of 1,024 ids: the proof of computation reads the trace training leaves on the sequences a miner trained
    # on, which is largely in the embedding rows of their tokens; over 256 byte ids a step leaves too little of it
    # to tell honest updates from others in a few evaluations (docs/scoring.md, "Proof of computation")
    hp = HParams(tokenizer="bpe",
                 model=ModelConfig(vocab_size=1024, d_model=64, n_layers=2, n_heads=2, ffn_hidden=128, seq_len=32))
    # one step on a batch of 16, all of it tested; the assignment holds two batches, for a diligent miner
    hp.batch_size, hp.assigned_sequences, hp.micro_batch = 16, 32, 16
    hp.blocks_per_window, hp.put_window_seconds = 8, 1.5
    hp.eval_sequences, hp.eval_peers, hp.val_sequences = 16, 3, 16
    hp.learning_rate, hp.warmup_windows, hp.checkpoint_every = 5e-3, 0, 2
    hp.chunk, hp.topk = 32, 16
    # one top-k for every tensor, as these networks' incentive assertions were calibrated: the default
    # per-kind counts are absolute (embed_topk 56 of a 32×32 chunk's 1,024 coefficients, against 16) and
    # enlarge the noise miner's evaluation step in the embedding; it passed the help gate in the final row
    # of 2 of 5 adversary-zoo runs (docs/scoring.md, "A lucky noise update")
    hp.embed_topk = hp.attn_topk = hp.ffn_topk = 0
    hp.inner.steps_max = 2  # at most two inner AdamW steps (the whole assignment): a miner takes one per window
    hp.inner.warmup_steps = 0  # one step a window: a 10-step warm-up would take most of a short test run
    return hp
