"""The model sharded over a node's ranks with FSDP2 (``torch.distributed.fsdp.fully_shard``).

Built on the meta device, so no rank ever holds the whole model: consecutive blocks form FSDP units of at
least UNIT_BYTES of parameters (one block each from the ``125m`` preset on; a small model is one unit) and
the root holds the embedding (tied with the output head) and the final norm; ``to_empty`` then gives each rank
memory for its own slices only, which the caller fills slice by slice (dso/distributed/sliced_theta.py streams θ from
the leader, one parameter at a time).  Parameters, gradients and the optimiser's moments all live as
slices; a unit's whole parameters exist only while it runs (all-gathered, freed after its forward and
backward).

Each parameter is sliced along the dimension :func:`dso.distributed.sharding.shard_dim` picks, so that the codec can
compress every rank's slice on its own (dso/distributed/sharded_codec.py).
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard

from dso.codec.codecs import Codec
from dso.codec.dct import ChunkPlan
from dso.codec.demo import DeMoCodec
from dso.config.schema import ModelConfig
from dso.distributed.ranks import Ranks
from dso.distributed.sharding import shard_dim
from dso.nn.model import Decoder, parameter_shapes

UNIT_BYTES = 16 * 1024 * 1024  # blocks per FSDP unit: at least this many bytes of parameters (a 125m block: 28 MB)


def shard_dims(plans: Mapping[str, ChunkPlan], world: int) -> dict[str, int]:
    """Parameter name → the dimension FSDP slices it along (0 where no dimension gives whole chunks)."""
    return {name: shard_dim(plan, world) or 0 for name, plan in plans.items()}


def codec_shard_dims(codec: Codec, world: int) -> dict[str, int]:
    """:func:`shard_dims` for the run's codec: DeMo's chunk plans; dim 0 for a codec without chunks."""
    if isinstance(codec, DeMoCodec):
        return shard_dims(codec.plans, world)
    return {name: 0 for name in codec.shapes}


def units(model: Decoder, unit_bytes: int) -> list[list[torch.nn.Module]]:
    """Consecutive blocks grouped into FSDP units of at least ``unit_bytes`` of parameters (float32): a unit's
    whole parameters exist only while it runs, and every unit costs a few collectives per micro-batch, which
    on a busy machine cost more than the memory a smaller unit saves.  The last unit takes what is left."""
    groups: list[list[torch.nn.Module]] = [[]]
    size = 0
    for block in model.blocks:
        if size >= unit_bytes:
            groups.append([])
            size = 0
        groups[-1].append(block)
        size += 4 * sum(p.numel() for p in block.parameters())
    return [g for g in groups if g]


def sharded_model(cfg: ModelConfig, ranks: Ranks, dims: Mapping[str, int],
                  activation_checkpointing: bool = False) -> Decoder:
    """The model's structure on every rank, each parameter a DTensor sliced along ``dims[name]``; the
    slices' memory is uninitialised (fill them before use), the rotary tables are set."""
    with torch.device("meta"):
        model = Decoder(cfg)
    model.activation_checkpointing = activation_checkpointing
    names = {id(p): n for n, p in model.named_parameters()}

    def placement(param: torch.nn.Parameter) -> Shard:
        return Shard(dims[names[id(param)]])

    for unit in units(model, UNIT_BYTES):
        fully_shard(unit, shard_placement_fn=placement)
    fully_shard(model, shard_placement_fn=placement)
    model.to_empty(device=ranks.device)
    model.reset_rotary()
    return model


def shapes_of(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Parameter shapes of the model ``cfg`` describes, without memory for it (meta device)."""
    with torch.device("meta"):
        return parameter_shapes(Decoder(cfg))


def local_slices(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameter name → this rank's slice (a view: writing it writes the parameter)."""
    out = {}
    for name, p in model.named_parameters():
        out[name] = p.to_local() if isinstance(p, DTensor) else p
    return out
