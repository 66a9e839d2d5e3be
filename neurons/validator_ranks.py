"""One validator on several ranks: ``torchrun --nproc_per_node N neurons/validator.py …``.

Rank 0 is the validator of neurons/validator.py: it alone gathers, aggregates, keeps the scoring state,
publishes and posts weights.  What it shares is the window's most expensive part, the primary evaluation
(per evaluated peer, forward passes over its sampled trained sequences at θ'_p and at θ_t − control, and over
the window's random ones at θ'_p): the peers to evaluate are dealt round-robin over the ranks in uid order, every
rank evaluates its share on its own copy of θ_t with the very function one process uses
(scoring.evaluation.evaluate_peers, a black box here), and the per-sequence losses come back to rank 0, which goes
on exactly as one process would.  On the CPU every rank computes the same bits as one process would (the same
θ_t, the same data, the same operations, one thread each), so scores and weights are identical; on GPUs they
agree to the reduction order of the device's kernels (docs/gpu.md, docs/scale.md).

Per window, rank 0 sends each other rank θ_t and the consensus step (packed in a few broadcasts), the random
sequences with their losses at θ_t and θ_t − control (measured once, on rank 0), and for each of its peers the
update (the codec's own wire tensors, checked again there) and the sampled trained sequences; a rank answers with
each peer's per-sequence losses or the rejection its update earned.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dso.codec.codecs import Codec, make_codec
from dso.config.schema import Config, HParams
from dso.distributed.fsdp import shapes_of
from dso.distributed.ranks import Ranks, broadcast_tensor
from dso.nn.model import Decoder
from dso.protocol.rejections import Reason, Rejection, unexpected
from neurons.context import build_context
from neurons.ranks import Orders, Part, run_group
from neurons.validator import Validator
from scoring.evaluation import ParameterSnapshot, PeerLosses, RandomLosses, SharedInputs, evaluate_peers

BROADCAST_BUCKET_BYTES = 64 * 1024 * 1024


def broadcast_tensors(ranks: Ranks, tensors: Sequence[torch.Tensor]) -> None:
    """The leader's values of ``tensors`` into every rank's tensors of the same shapes (float32, in place),
    packed in buckets of at most BROADCAST_BUCKET_BYTES."""
    group: list[torch.Tensor] = []
    for i, t in enumerate(tensors):
        group.append(t)
        size = sum(q.numel() for q in group) * 4
        if size >= BROADCAST_BUCKET_BYTES or i == len(tensors) - 1:
            with torch.no_grad():
                flat = (torch.cat([q.detach().reshape(-1).float() for q in group]) if ranks.leader
                        else torch.empty(size // 4, dtype=torch.float32))
                flat = flat.to(ranks.comm_device)
                dist.broadcast(flat, 0)
                if not ranks.leader:
                    for q, piece in zip(group, torch.split(flat, [q.numel() for q in group]), strict=True):
                        q.copy_(piece.reshape(q.shape))
            group = []


def _encode(result: PeerLosses | Rejection) -> dict[str, Any]:
    if isinstance(result, Rejection):
        return {"reason": result.reason.value, "detail": result.detail}
    # float64 → Python float → JSON → float64 round-trips exactly (repr is the shortest exact form)
    return {"losses": [result.control_assigned.tolist(), result.stepped_assigned.tolist(),
                       result.stepped_rand.tolist()]}


def _decode(item: Mapping[str, Any], random: RandomLosses) -> PeerLosses | Rejection:
    if "losses" in item:
        control_assigned, stepped_assigned, stepped_rand = (torch.tensor([float(x) for x in losses],
                                                                         dtype=torch.float64)
                                                            for losses in item["losses"])
        return PeerLosses(control_assigned, stepped_assigned, random.base, random.control, stepped_rand)
    return Rejection(Reason(item["reason"]), str(item["detail"]))


class SharedEvaluation:
    """The evaluation both sides run (collective): θ_t, the control step, the random side and each peer's inputs
    to its rank, each rank's share evaluated with scoring.evaluation.evaluate_peers, the results to the leader."""

    def __init__(self, ranks: Ranks, codec: Codec, hp: HParams, model: Decoder):
        self.ranks, self.codec, self.hp, self.model = ranks, codec, hp, model
        self.spec = codec.wire_spec()
        self.shapes = dict(shapes_of(hp.model))

    def run(self, order: Mapping[str, Any], snapshot: ParameterSnapshot | None = None,
            shared: SharedInputs | None = None,
            jobs: Mapping[int, tuple[Any, torch.Tensor]] | None = None) -> dict[int, PeerLosses | Rejection] | None:
        """``order`` (:meth:`RankedEvaluator.order`) on every rank; ``snapshot``, ``shared`` and ``jobs`` on the
        leader only."""
        ranks = self.ranks
        uids = [int(u) for u in order["uids"]]
        broadcast_tensors(ranks, [p for _, p in self.model.named_parameters()])
        if ranks.leader:
            assert shared is not None and jobs is not None and snapshot is not None
            self.share_inputs(shared)
        else:
            snapshot = ParameterSnapshot(self.model)  # this rank's θ_t, restored after each peer
            shared = self._shared_inputs(order)
        mine: dict[int, tuple[Any, torch.Tensor]] = {}
        failed: dict[int, PeerLosses | Rejection] = {}
        trained_shapes = {int(u): tuple(s) for u, s in order["trained_shapes"].items()}
        for position, uid in enumerate(uids):
            rank = position % ranks.world
            if rank == 0:
                if ranks.leader and jobs is not None:
                    mine[uid] = jobs[uid]
            elif ranks.leader and jobs is not None:
                self._send(jobs[uid], rank)
            elif ranks.rank == rank:
                got = self._receive(int(order["window"]), trained_shapes[uid])
                if isinstance(got, Rejection):
                    failed[uid] = got
                else:
                    mine[uid] = got
        results = {**failed, **evaluate_peers(self.model, snapshot, self.codec, self.hp, shared, mine)}
        return self._collect(results, uids, shared.random)

    def share_inputs(self, shared: SharedInputs) -> None:
        """The leader's side of :meth:`_shared_inputs`."""
        if shared.control is not None:
            broadcast_tensors(self.ranks, [shared.control[name] for name in self.shapes])
        random = shared.random
        broadcast_tensor(self.ranks, random.batch, tuple(random.batch.shape), torch.int64)
        broadcast_tensor(self.ranks, random.base, tuple(random.base.shape), torch.float64)
        if shared.control is not None:
            broadcast_tensor(self.ranks, random.control, tuple(random.control.shape), torch.float64)

    def _shared_inputs(self, order: Mapping[str, Any]) -> SharedInputs:
        control = None
        if order["control"]:
            control = {name: torch.empty(shape) for name, shape in self.shapes.items()}
            broadcast_tensors(self.ranks, list(control.values()))
        rand_shape = tuple(order["rand_shape"])
        batch = broadcast_tensor(self.ranks, None, rand_shape, torch.int64).cpu()
        base = broadcast_tensor(self.ranks, None, rand_shape[:1], torch.float64).cpu()
        controlled = base if control is None else broadcast_tensor(self.ranks, None, rand_shape[:1],
                                                                   torch.float64).cpu()
        return SharedInputs(int(order["window"]), {k: float(v) for k, v in order["reference"].items()},
                            self.shapes, control, RandomLosses(batch, base, controlled))

    def _send(self, job: tuple[Any, torch.Tensor], rank: int) -> None:
        update, trained = job
        arrays = self.codec.to_wire(update)
        for key in self.spec:
            dist.send(torch.from_numpy(np.ascontiguousarray(arrays[key])).to(self.ranks.comm_device), rank)
        if trained.numel():
            dist.send(trained.to(self.ranks.comm_device).contiguous(), rank)

    def _receive(self, window: int, trained_shape: tuple[int, ...]) -> tuple[Any, torch.Tensor] | Rejection:
        arrays = {}
        for key, (dtype, shape) in self.spec.items():
            t = torch.from_numpy(np.zeros(shape, dtype=dtype)).to(self.ranks.comm_device)
            dist.recv(t, 0)
            arrays[key] = t.cpu().numpy()
        trained = torch.empty(trained_shape, dtype=torch.int64, device=self.ranks.comm_device)
        if trained.numel():
            dist.recv(trained, 0)
        try:
            return self.codec.from_wire(arrays, window), trained.cpu()
        except Exception as e:  # noqa: BLE001 — it decoded on the leader; never let a peer's bytes stop a rank
            return unexpected(Reason.MALFORMED, e)

    def _collect(self, results: dict[int, PeerLosses | Rejection], uids: list[int], random: RandomLosses
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
            merged.update({int(u): _decode(r, random)
                           for u, r in json.loads(bytes(buf.cpu().numpy().tobytes())).items()})
        return {uid: merged[uid] for uid in uids}


class RankedEvaluator:
    """The leader's scoring.evaluation.PeerEvaluator: announces the window's evaluation, then runs its share."""

    def __init__(self, ranks: Ranks, orders: Orders, codec: Codec, hp: HParams, model: Decoder):
        self.orders = orders
        self.shared = SharedEvaluation(ranks, codec, hp, model)

    @staticmethod
    def order(shared: SharedInputs, jobs: Mapping[int, tuple[Any, torch.Tensor]]) -> dict[str, Any]:
        return {"window": shared.window, "reference": dict(shared.reference), "uids": list(jobs),
                "rand_shape": list(shared.random.batch.shape), "control": shared.control is not None,
                "trained_shapes": {str(u): list(t.shape) for u, (_, t) in jobs.items()}}

    def __call__(self, model: Decoder, snapshot: ParameterSnapshot, codec: Any, hp: HParams, shared: SharedInputs,
                 jobs: Mapping[int, tuple[Any, torch.Tensor]]) -> dict[int, PeerLosses | Rejection]:
        order = self.order(shared, jobs)
        self.orders.send("evaluator", "evaluate", order)
        got = self.shared.run(order, snapshot, shared, jobs)
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
        self.shared.run(args)


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

