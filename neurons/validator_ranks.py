"""One validator on several ranks: ``torchrun --nproc_per_node N neurons/validator.py …``.

Rank 0 is the validator of neurons/validator.py: it alone gathers, aggregates, keeps the scoring state,
publishes and posts weights.  What it shares is the window's most expensive part, the primary evaluation
(three forward passes per evaluated peer): the peers to evaluate are dealt round-robin over the ranks in
uid order, every rank evaluates its share on its own copy of θ_t with the very function one process uses
(scoring.evaluation.evaluate_peers, a black box here), and the losses come back to rank 0, which goes on
exactly as one process would.  On the CPU every rank computes the same bits as one process would (the
same θ_t, the same data, the same operations, one thread each), so scores and weights are identical; on
GPUs they agree to the reduction order of the device's kernels (docs/gpu.md, docs/scale.md).

Per window, rank 0 sends each other rank θ_t (packed in a few broadcasts), D_rand, and for each of its
peers the update (the codec's own wire tensors, checked again there) and the assigned sequences; a rank
answers with each peer's four losses or the rejection its update earned.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

import numpy as np
import torch
import torch.distributed as dist

from dso.codecs import Codec, make_codec
from dso.config import Config, HParams
from dso.distributed import Ranks, broadcast_tensor
from dso.fsdp import shapes_of
from dso.model import Decoder
from dso.rejections import Reason, Rejection, unexpected
from neurons.context import build_context
from neurons.ranks import Orders, Part, run_group
from neurons.validator import Validator
from scoring.evaluation import PeerLosses, evaluate_peers

BROADCAST_BUCKET_BYTES = 64 * 1024 * 1024


def share(uids: list[int], rank: int, world: int) -> list[int]:
    """The peers rank evaluates: every world-th, from its own place, in uid order."""
    return uids[rank::world]


def broadcast_model(ranks: Ranks, model: torch.nn.Module) -> None:
    """The leader's parameters into every rank's model, packed in buckets of at most BROADCAST_BUCKET_BYTES."""
    params = [p for _, p in model.named_parameters()]
    group: list[torch.nn.Parameter] = []
    for i, p in enumerate(params):
        group.append(p)
        size = sum(q.numel() for q in group) * 4
        if size >= BROADCAST_BUCKET_BYTES or i == len(params) - 1:
            with torch.no_grad():
                flat = (torch.cat([q.detach().reshape(-1).float() for q in group]) if ranks.leader
                        else torch.empty(size // 4, dtype=torch.float32))
                flat = flat.to(ranks.comm_device)
                dist.broadcast(flat, 0)
                if not ranks.leader:
                    for q, piece in zip(group, torch.split(flat, [q.numel() for q in group])):
                        q.copy_(piece.reshape(q.shape))
            group = []


def _encode(result: PeerLosses | Rejection) -> dict[str, Any]:
    if isinstance(result, Rejection):
        return {"reason": result.reason.value, "detail": result.detail}
    return {"losses": [result.base_assigned, result.stepped_assigned, result.base_rand, result.stepped_rand]}


def _decode(item: Mapping[str, Any]) -> PeerLosses | Rejection:
    if "losses" in item:
        return PeerLosses(*(float(x) for x in item["losses"]))
    return Rejection(Reason(item["reason"]), str(item["detail"]))


class SharedEvaluation:
    """The evaluation both sides run (collective): θ_t, D_rand and each peer's inputs to its rank, each rank's
    share evaluated with scoring.evaluation.evaluate_peers, the results to the leader."""

    def __init__(self, ranks: Ranks, codec: Codec, hp: HParams, model: Decoder):
        self.ranks, self.codec, self.hp, self.model = ranks, codec, hp, model
        self.spec = codec.wire_spec()

    def run(self, window: int, reference: Mapping[str, float], uids: list[int], rand_shape: tuple[int, ...],
            assigned_shapes: Mapping[int, tuple[int, ...]], base_rand: float,
            jobs: Mapping[int, tuple[Any, torch.Tensor]] | None = None,
            rand: torch.Tensor | None = None) -> dict[int, PeerLosses | Rejection] | None:
        ranks = self.ranks
        broadcast_model(ranks, self.model)
        rand = broadcast_tensor(ranks, rand, rand_shape, torch.int64).cpu()
        mine: dict[int, tuple[Any, torch.Tensor]] = {}
        failed: dict[int, PeerLosses | Rejection] = {}
        for position, uid in enumerate(uids):
            rank = position % ranks.world
            if rank == 0:
                if ranks.leader and jobs is not None:
                    mine[uid] = jobs[uid]
                continue
            if ranks.leader and jobs is not None:
                self._send(jobs[uid], rank)
            elif ranks.rank == rank:
                got = self._receive(window, assigned_shapes[uid])
                if isinstance(got, Rejection):
                    failed[uid] = got
                else:
                    mine[uid] = got
        results = {**failed, **evaluate_peers(self.model, self.codec, self.hp, window, reference,
                                              dict(shapes_of(self.hp.model)), mine, rand, base_rand)}
        return self._collect(results, uids)

    def _send(self, job: tuple[Any, torch.Tensor], rank: int) -> None:
        update, assigned = job
        arrays = self.codec.to_wire(update)
        for key in self.spec:
            dist.send(torch.from_numpy(np.ascontiguousarray(arrays[key])).to(self.ranks.comm_device), rank)
        dist.send(assigned.to(self.ranks.comm_device).contiguous(), rank)

    def _receive(self, window: int, assigned_shape: tuple[int, ...]) -> tuple[Any, torch.Tensor] | Rejection:
        arrays = {}
        for key, (dtype, shape) in self.spec.items():
            t = torch.from_numpy(np.zeros(shape, dtype=dtype)).to(self.ranks.comm_device)
            dist.recv(t, 0)
            arrays[key] = t.cpu().numpy()
        assigned = torch.empty(assigned_shape, dtype=torch.int64, device=self.ranks.comm_device)
        dist.recv(assigned, 0)
        try:
            return self.codec.from_wire(arrays, window), assigned.cpu()
        except Exception as e:  # noqa: BLE001 — it decoded on the leader; never let a peer's bytes stop a rank
            return unexpected(Reason.MALFORMED, e)

    def _collect(self, results: dict[int, PeerLosses | Rejection], uids: list[int]
                 ) -> dict[int, PeerLosses | Rejection] | None:
        """Every rank's results on the leader (one JSON message per rank)."""
        ranks = self.ranks
        if not ranks.leader:
            data = json.dumps({str(u): _encode(r) for u, r in results.items()}).encode()
            dist.send(torch.tensor([len(data)], dtype=torch.int64, device=ranks.comm_device), 0)
            dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(ranks.comm_device), 0)
            return None
        merged = dict(results)
        for rank in range(1, ranks.world):
            size = torch.zeros(1, dtype=torch.int64, device=ranks.comm_device)
            dist.recv(size, rank)
            buf = torch.empty(int(size.item()), dtype=torch.uint8, device=ranks.comm_device)
            dist.recv(buf, rank)
            merged.update({int(u): _decode(r) for u, r in json.loads(bytes(buf.cpu().numpy().tobytes())).items()})
        return {uid: merged[uid] for uid in uids}


class RankedEvaluator:
    """The leader's scoring.evaluation.PeerEvaluator: announces the window's evaluation, then runs its share."""

    def __init__(self, ranks: Ranks, orders: Orders, codec: Codec, hp: HParams, model: Decoder):
        self.orders = orders
        self.shared = SharedEvaluation(ranks, codec, hp, model)

    def __call__(self, model: Decoder, codec: Any, hp: HParams, window: int, reference: Mapping[str, float],
                 shapes: Mapping[str, tuple[int, ...]], jobs: Mapping[int, tuple[Any, torch.Tensor]],
                 rand: torch.Tensor, base_rand: float) -> dict[int, PeerLosses | Rejection]:
        uids = list(jobs)
        self.orders.send("evaluator", "evaluate", {
            "window": window, "reference": dict(reference), "uids": uids, "rand_shape": list(rand.shape),
            "assigned_shapes": {str(u): list(a.shape) for u, (_, a) in jobs.items()}, "base_rand": base_rand})
        got = self.shared.run(window, reference, uids, tuple(rand.shape),
                              {u: tuple(a.shape) for u, (_, a) in jobs.items()}, base_rand, jobs, rand)
        assert got is not None  # the leader's
        return got


class EvaluationFollower:
    """A rank other than the leader: its own model and the leader's evaluation orders."""

    def __init__(self, cfg: Config, ranks: Ranks, hp: HParams):
        torch.set_num_threads(cfg.threads)
        with torch.device("meta"):
            model = Decoder(hp.model)
        model.to_empty(device=ranks.device)
        model.reset_rotary()
        self.shared = SharedEvaluation(ranks, make_codec(shapes_of(hp.model), hp), hp, model)

    def handle(self, op: str, args: Mapping[str, Any]) -> None:
        if op != "evaluate":
            raise ValueError(f"unknown order {op!r}")
        self.shared.run(int(args["window"]), {k: float(v) for k, v in args["reference"].items()},
                        [int(u) for u in args["uids"]], tuple(args["rand_shape"]),
                        {int(u): tuple(s) for u, s in args["assigned_shapes"].items()}, float(args["base_rand"]))


def follower_parts(cfg: Config, ranks: Ranks, hp: HParams) -> dict[str, Part]:
    return {"evaluator": EvaluationFollower(cfg, ranks, hp)}


def serve_ranks(cfg: Config) -> int:
    """This process's part of a torchrun validator: the validator on rank 0, an evaluator elsewhere."""

    def lead(ranks: Ranks, orders: Orders) -> int:
        ctx = build_context(cfg, "validator")
        orders.hello(ctx.hp)
        validator = Validator(ctx)
        validator.evaluator = RankedEvaluator(ranks, orders, ctx.codec, ctx.hp, ctx.model)
        return validator.run()

    return run_group(cfg, lead, follower_parts)

