"""One miner on several ranks: ``torchrun --nproc_per_node N neurons/miner.py …``.

Rank 0 is the miner of neurons/miner.py — it alone talks to the chain and S3 and decides every step.  No
rank holds the whole θ: the training state is spread over every rank with FSDP2 — each rank holds its
slices of the local weights, the anchor θ_t, the gradients, the AdamW moments and the error-feedback buffer
(dso/distributed/fsdp.py, dso/distributed/sharded_inner.py, dso/distributed/sharded_codec.py) — and the
anchor slices are the node's θ, which it follows the network in (dso/distributed/sliced_theta.py: bundles
applied, checkpoints loaded, θ hashed and sampled, collectively; the leader's ``ctx.model`` is the structure
only).  Each window every rank starts from its anchor slices, trains its slice of every step's batch, and
compresses its slices; the leader puts the update together and uploads it.  The update is the one a single
process would send for the same pseudo-gradient, bit for bit, and the pseudo-gradient is a single process's
up to rounding (docs/scale.md has the measurements).

The other ranks never open a connection: they build the sharded model from the leader's hyper-parameters
and carry out its orders (neurons/ranks.py) until it stops them.  Each rank keeps its own state files
(``…rank{r}-of-{N}.safetensors``); a miner restarted with another number of ranks starts its error
feedback and optimiser afresh.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from dso.codec.codecs import Codec, make_codec
from dso.codec.demo import CompressedUpdate, Release
from dso.config.schema import Config, HParams
from dso.distributed.fsdp import codec_shard_dims, shapes_of, sharded_model
from dso.distributed.ranks import Ranks
from dso.distributed.sharded_codec import ShardedFeedback
from dso.distributed.sharded_inner import ShardedInnerLoop
from dso.distributed.sliced_theta import SlicedTheta
from dso.nn.model import initial_tensors
from neurons.context import build_context
from neurons.miner import Miner
from neurons.persist import load_tensors, save_tensors
from neurons.ranks import Orders, Part, run_group

log = logging.getLogger("dso.miner")


def ranked_training(hp: HParams, codec: Codec, ranks: Ranks, activation_checkpointing: bool,
                    orders: Orders | None) -> tuple[ShardedFeedback, ShardedInnerLoop, SlicedTheta]:
    """The sharded error feedback, inner loop and θ (the inner loop's anchor), built alike on every rank (the
    leader passes its orders)."""
    dims = codec_shard_dims(codec, ranks.world)
    model = sharded_model(hp.model, ranks, dims, activation_checkpointing)
    inner = ShardedInnerLoop(model, hp, ranks, dims, None if orders is None else orders.announcer("inner"))
    theta = SlicedTheta(inner.anchor, codec.shapes, dims, ranks, hp, None if orders is None else
                        orders.announcer("theta"))
    return ShardedFeedback(codec, hp.ef_beta, ranks, dims, whole=hp.dp.enabled), inner, theta


def state_files(state_dir: Path, ranks: Ranks) -> tuple[Path, Path]:
    suffix = f"rank{ranks.rank}-of-{ranks.world}.safetensors"
    return state_dir / f"error_feedback.{suffix}", state_dir / f"inner_state.{suffix}"


class RankedMiner(Miner):
    """The miner on rank 0 of its group."""

    feedback: ShardedFeedback
    inner: ShardedInnerLoop

    def __init__(self, ctx: Any, ranks: Ranks, orders: Orders):
        self.ranks, self.orders = ranks, orders
        super().__init__(ctx)
        self.inner.warm_up()
        log.info("training on %d ranks: %d tensors compressed in slices, %d gathered on rank 0", ranks.world,
                 len(self.feedback.parts), len(self.feedback.gathered))

    def training_parts(self) -> tuple[ShardedFeedback, ShardedInnerLoop]:
        """The training parts and the node's θ, which starts as θ_0, streamed a tensor at a time."""
        ctx = self.ctx
        feedback, inner, sliced = ranked_training(ctx.hp, ctx.codec, self.ranks,
                                                  ctx.cfg.neuron.activation_checkpointing, self.orders)
        sliced.load(initial_tensors(ctx.hp.model, ctx.hp.seed))
        ctx.ranked_theta = sliced  # what the node follows the network with, hashes and samples
        return feedback, inner

    def state_files(self) -> tuple[Path, Path]:
        return state_files(self.ctx.state_dir, self.ranks)

    def save_state(self) -> None:
        self.orders.send("node", "save")
        super().save_state()

    def compressor(self) -> OrderedFeedback:
        return OrderedFeedback(self.feedback, self.orders)

    def theta_hash(self) -> str:
        return self.theta.hash()  # the anchor slices are θ_{model_window} throughout

    def run(self) -> int:
        try:
            return super().run()
        finally:
            self.orders.stop()


class OrderedFeedback:
    """The leader's error feedback step, a collective: it orders every other rank to take its part first."""

    def __init__(self, feedback: ShardedFeedback, orders: Orders):
        self.feedback, self.orders = feedback, orders

    def step(self, grads: Mapping[str, torch.Tensor], window: int, uid: int = 0,
             release: Release | None = None) -> CompressedUpdate | None:
        self.orders.send("feedback", "step", {"window": window})
        return self.feedback.step(grads, window, uid, release)


class Follower:
    """A rank other than the leader: its slices of the training state and of θ, and the leader's orders about
    them (``node``: save the state; ``feedback``: compress the window's slices; ``theta``: follow the network)."""

    def __init__(self, cfg: Config, ranks: Ranks, hp: HParams):
        self.ranks = ranks
        self.codec = make_codec(shapes_of(hp.model), hp)
        self.feedback, self.inner, self.theta = ranked_training(hp, self.codec, ranks,
                                                                cfg.neuron.activation_checkpointing, None)
        state_dir = Path(cfg.neuron.state_dir).expanduser() / f"{cfg.wallet.name}-{cfg.wallet.hotkey}" / "miner"
        state_dir.mkdir(parents=True, exist_ok=True)
        self.ef_file, self.inner_file = state_files(state_dir, ranks)
        saved = load_tensors(self.ef_file)
        if saved is not None:
            self.feedback.load_state(saved)
        saved = load_tensors(self.inner_file)
        if saved is not None:
            self.inner.load_state(saved)

    def parts(self) -> dict[str, Part]:
        return {"inner": self.inner, "theta": self.theta, "feedback": _Orders(self.compress),
                "node": _Orders(self.node)}

    def node(self, op: str, args: Mapping[str, Any]) -> None:
        if op != "save":
            raise ValueError(f"unknown order {op!r}")
        save_tensors(self.ef_file, self.feedback.state())
        save_tensors(self.inner_file, self.inner.state())

    def compress(self, op: str, args: Mapping[str, Any]) -> None:
        if op != "step":
            raise ValueError(f"unknown order {op!r}")
        self.feedback.step(self.inner.pseudo_gradient(), int(args["window"]))


class _Orders:
    """A part whose orders one function carries out."""

    def __init__(self, fn: Callable[[str, Mapping[str, Any]], None]):
        self.handle = fn


def follower_parts(cfg: Config, ranks: Ranks, hp: HParams) -> dict[str, Part]:
    return Follower(cfg, ranks, hp).parts()


def serve_ranks(cfg: Config) -> int:
    """This process's part of a torchrun miner: the miner on rank 0, a follower elsewhere."""

    def lead(ranks: Ranks, orders: Orders) -> int:
        ctx = build_context(cfg, "miner", whole_model=False)  # θ lives in the ranks' slices
        orders.hello(ctx.hp)
        return RankedMiner(ctx, ranks, orders).run()

    return run_group(cfg, lead, follower_parts)
