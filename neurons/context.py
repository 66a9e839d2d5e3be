"""Node wiring in one place: everything a miner or a validator works with, built once from the config.

Start-up order: chain (a missing local network ends the process with one line
saying how to start it) → wallet → registration → own bucket and its published
read credentials → data (pinned by hash) → θ_0 and the codec.  Both roles
receive the same typed :class:`NodeContext`; nothing else opens connections.
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch

from dso.chain import Chain, ChainError, ChainUnavailable
from dso.chain.base import STATE_HISTORY_BLOCKS
from dso.chain.cached import CachedChain
from dso.chain.factory import open_chain
from dso.chain.roles import VALIDATOR, with_role
from dso.chain.wallets import WalletError, hotkey_address, load_wallet
from dso.codec.codecs import Codec, Shapes, make_codec
from dso.config.schema import Config, HParams, expand
from dso.data.corpus import DataError
from dso.data.dataset import Dataset
from dso.nn.model import Decoder, build_model, parameter_shapes
from dso.protocol.clock import Clock
from dso.protocol.rejections import Rejection
from dso.training.outer import OuterState
from neurons import distrust
from neurons.lifecycle import Fatal, StopFlag
from neurons.manifest import manifest, manifest_problem, run_of
from neurons.metered_chain import MeteredChain
from neurons.metrics import NodeMetrics, start_metrics
from neurons.theta import Theta, WholeTheta
from storage import keys
from storage.client import ObjectReader, S3Client, StorageError
from storage.commitment import BucketInfo, format_commitment, parse_commitment
from storage.dataset import open_dataset
from storage.gather import ReaderCache
from storage.jsonobj import get_json, put_json

log = logging.getLogger("dso")
Source = tuple[ObjectReader, str]  # a client and the bucket it reads


@dataclass(frozen=True)
class OwnBucket:
    client: S3Client
    bucket: str


class PeerDirectory:
    """Who the other nodes are and how to read them: commitments → read-only clients, and the leader.

    Validators are the permit holders that mark themselves as running this protocol (a role tag in their
    commitment, dso/chain/roles.py); every other registered uid is scored as a miner, also one that earned
    a permit (on the real chain a miner's incentive becomes stake).  The leader is the largest-stake
    protocol validator that posted weights within ``leader_idle_blocks``, so a stopped leader hands over.

    Who leads window t is decided by the chain as it stood at window t's last block (:meth:`decision_block`):
    every node that asks about window t gets the same answer whenever it asks, so during a hand-over no two
    validators both believe they lead, and no miner applies a bundle the next leader does not build on."""

    def __init__(self, chain: Chain, readers: ReaderCache, uid: int, own: OwnBucket, leader_idle_blocks: int,
                 clock: Clock):
        self.chain, self.readers, self.uid, self.own = chain, readers, uid, own
        self.leader_idle_blocks, self.clock = leader_idle_blocks, clock
        # validators this node refused to follow (a bundle with a payload its miner did not sign, or one holding a
        # payload this validator rejected): skipped as sources of bundles and checkpoints, across restarts too
        # (neurons/distrust.py)
        self.distrusted: set[int] = set()

    def commitments(self) -> dict[int, str | None]:
        """uid → raw commitment of every registered uid (parsed and validated by whoever reads it)."""
        published = self.chain.commitments()
        return {n.uid: published.get(n.uid) for n in self.chain.metagraph()}

    def validators(self) -> set[int]:
        return {n.uid for n in self.chain.protocol_validators()}

    def miners(self) -> dict[int, str]:
        """uid → hotkey of every registered peer that is not a protocol validator, nor ourselves."""
        validators = self.validators()
        return {n.uid: n.hotkey for n in self.chain.metagraph() if n.uid != self.uid and n.uid not in validators}

    def hotkeys(self) -> dict[int, str]:
        """uid → hotkey of every registered uid: whose signature each payload must carry
        (dso/protocol/signatures.py)."""
        return {n.uid: n.hotkey for n in self.chain.metagraph()}

    def reader(self, uid: int) -> Source | Rejection:
        if uid == self.uid:
            return self.own.client, self.own.bucket
        info = parse_commitment(self.chain.commitment(uid))
        if isinstance(info, Rejection):
            return info
        return self.readers.get(info), info.bucket

    def sources(self, window: int | None = None) -> list[int]:
        """Where a node takes ``window``'s bundle from: the live protocol validators by stake (the leader first, as
        :meth:`leader_uid` decides it), without those it refused to follow."""
        block = self.decision_block(window)
        live = [n for n in self.chain.protocol_validators(block)
                if n.last_update > 0 and block - n.last_update <= self.leader_idle_blocks]
        return [n.uid for n in live if n.uid not in self.distrusted]

    def decision_block(self, window: int | None = None) -> int:
        """The block whose state decides who leads ``window``: its last block, once a later one exists (a
        settled state).  Without a window, or while that block is not settled yet: the latest settled block.
        A window older than the chain's state history falls back to the oldest block still kept."""
        latest = max(0, self.chain.block() - 1)
        if window is None:
            return latest
        last = self.clock.first_block(window + 1) - 1
        return max(min(last, latest), latest - STATE_HISTORY_BLOCKS + 1)

    def leader_uid(self, window: int | None = None) -> int | None:
        """The leading validator of ``window`` (default: of the latest settled block), None if there is none."""
        lead = self.chain.leading_protocol_validator(self.leader_idle_blocks, block=self.decision_block(window))
        return lead.uid if lead else None

    def leader(self, window: int | None = None) -> Source | Rejection | None:
        """Where the objects of ``window``'s leading validator are (None: no validator yet).  A leader this node
        refused to follow is passed over for the next validator by stake it still follows."""
        uid = self.leader_uid(window)
        if uid is not None and uid in self.distrusted:
            uid = next(iter(self.sources(window)), None)
        if uid is None:
            return None
        return self.reader(uid)


class EventLog:
    """One record per window: a JSON line (the local network's live view and its report read them) and
    the listeners (the node's metrics derive from it)."""

    def __init__(self, path: str, role: str, uid: int):
        self.role, self.uid = role, uid
        self._file: IO[str] | None = open(expand(path), "a") if path else None
        self.listeners: list[Callable[[dict[str, Any]], None]] = []

    def emit(self, record: dict[str, Any]) -> None:
        line = {"role": self.role, "uid": self.uid, "time": time.time(), **record}
        if self._file:
            self._file.write(json.dumps(line) + "\n")
            self._file.flush()
        for listener in self.listeners:
            try:
                listener(line)
            except Exception:  # noqa: BLE001 — watching a node must never stop it
                log.exception("window record listener %r failed", listener)


@dataclass
class NodeContext:
    """A node's connections and shared state.  ``model`` holds the node's θ (a miner on several ranks: the
    structure only, θ is in its ranks' slices, neurons/miner_ranks.py); ``run`` is the network run the node
    takes part in ("" until it is known: a validator's genesis, or the leader's manifest)."""

    cfg: Config
    role: str
    device: torch.device
    stop: StopFlag
    chain: CachedChain
    clock: Clock
    wallet: Any
    hotkey: str
    uid: int
    own: OwnBucket
    peers: PeerDirectory
    readers: ReaderCache
    dataset: Dataset
    model: Decoder
    codec: Codec
    state_dir: Path
    events: EventLog
    run: str = ""
    metrics: NodeMetrics | None = None  # served on --neuron.metrics_port (None: off)
    outer: OuterState = field(default_factory=OuterState)  # the outer step's state next to θ (dso/training/outer.py)
    ranked_theta: Theta | None = None  # a miner on several ranks: θ in its ranks' slices (neurons/miner_ranks.py)

    @property
    def hp(self) -> HParams:
        return self.cfg.hparams

    @property
    def shapes(self) -> Shapes:
        return self.codec.shapes

    @property
    def theta(self) -> Theta:
        """The node's θ, what it follows the network with (neurons/theta.py): its model, or its ranks' slices."""
        return WholeTheta(self.model) if self.ranked_theta is None else self.ranked_theta

    def manifest(self, genesis_window: int = 0) -> dict[str, Any]:
        return manifest(self.hp, self.dataset.data_hash, self.run, genesis_window)

    def leader_run(self) -> str | None:
        """The run id in the leading validator's manifest; None while there is no leader or usable manifest.
        Fatal if that run uses other protocol settings or data than ours."""
        lead = self.peers.leader()
        if lead is None or isinstance(lead, Rejection):
            self.chain.invalidate()  # look again next time, not at this window's cached view
            return None
        theirs = get_json(*lead, keys.manifest(self.hp.protocol_version))
        problem = manifest_problem(self.manifest(), theirs)
        if problem:
            raise Fatal(f"refusing to run: {problem}")
        run = run_of(theirs)
        if isinstance(run, Rejection):
            self.chain.invalidate()
            return None
        return run

    def join_run(self) -> bool:
        """Take the run id from the leading validator's manifest; refuse to run (Fatal) with other protocol
        settings or data than that run's.  False while there is no leader or manifest yet."""
        run = self.leader_run()
        if run is None:
            return False
        self.adopt_run(run)
        return True

    def adopt_run(self, run: str) -> None:
        if run != self.run:
            log.info("joining run %s", run)
        self.run = run

    def moved_run(self) -> str | None:
        """The leading validator's run when it is not ours (two validators that started at once each began
        one; the leader's wins), else None: the node must join it and reload its model from it."""
        try:
            run = self.leader_run() if self.run else None
        except Fatal as e:  # a running node never stops for a leader it cannot follow: it keeps its run
            log.warning("the leading validator's run is not one we can join: %s", e)
            return None
        if run is None or run == self.run:
            return None
        log.warning("the leading validator runs %s, not our run %s: joining it", run, self.run)
        return run

    def publish_manifest(self, genesis_window: int) -> None:
        put_json(self.own.client, self.own.bucket, keys.manifest(self.hp.protocol_version),
                 self.manifest(genesis_window))

    def wait_randomness(self, window: int, timeout: float = 5.0) -> bytes | None:
        """Chain randomness of the window (available once its put window has opened)."""
        deadline = time.time() + timeout
        while True:
            try:
                return self.clock.window_randomness(window)
            except ChainError:
                if time.time() > deadline or not self.stop.sleep(0.1):
                    return None


def build_context(cfg: Config, role: str, handle_signals: bool = True, whole_model: bool = True) -> NodeContext:
    """Wire a node; any problem ends the process with one line (:class:`Fatal`).  ``handle_signals``: SIGINT
    and SIGTERM stop the node after its current step (off when a node is embedded in another program).
    ``whole_model`` False: the model is its structure only (meta device), for a node whose ranks hold θ."""
    hp = cfg.hparams
    torch.set_num_threads(cfg.threads)
    device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise Fatal("--device cuda asked for, but torch sees no CUDA device")
    stop = StopFlag(install_handlers=handle_signals)
    metrics = _metrics(cfg, role)
    inner = _open_chain(cfg)
    if metrics is not None:  # chain writes show in the metrics; the node's code sees the same Chain
        inner = MeteredChain(inner, metrics.chain_write)
    chain = CachedChain(inner)  # reads cached per window: callers call chain.begin_window(t)
    try:
        wallet = load_wallet(cfg.wallet)
    except WalletError as e:
        raise Fatal(str(e)) from None
    hotkey = hotkey_address(wallet)
    try:
        uid = chain.register(wallet)
    except ChainError as e:
        raise Fatal(f"registration refused: {e}") from None
    own = _own_bucket(cfg, chain, wallet, hotkey, uid, role)
    readers = ReaderCache.from_config(cfg.storage)
    try:  # a local corpus, or shards in a dataset bucket (waits out an endpoint that does not answer yet)
        dataset = open_dataset(hp, cfg.data, cfg.storage, sleep=stop.sleep)
    except DataError as e:
        raise Fatal(str(e)) from None
    model = build_model(hp.model, hp.seed, device) if whole_model else structure_only(hp)
    state_dir = expand(cfg.neuron.state_dir) / f"{cfg.wallet.name}-{cfg.wallet.hotkey}" / role
    state_dir.mkdir(parents=True, exist_ok=True)
    clock = Clock(chain, hp.blocks_per_window, hp.put_window_seconds)
    ctx = NodeContext(cfg=cfg, role=role, device=device, stop=stop, chain=chain, clock=clock, wallet=wallet,
                      hotkey=hotkey, uid=uid, own=own, readers=readers,
                      peers=PeerDirectory(chain, readers, uid, own, leader_idle_blocks(cfg), clock),
                      dataset=dataset, model=model, codec=make_codec(parameter_shapes(model), hp),
                      state_dir=state_dir, events=EventLog(cfg.neuron.log_json, role, uid), metrics=metrics,
                      outer=OuterState.fresh(parameter_shapes(model), hp))
    ctx.peers.distrusted = distrust.load(state_dir, ctx.peers.hotkeys())  # refusals before a restart hold
    if metrics is not None:
        _attach_metrics(ctx, metrics)
    log.info("%s uid %d hotkey %s… bucket %s, data %s… from %s, hparams %s", role, uid, hotkey[:8], own.bucket,
             dataset.data_hash[:10], cfg.data.corpus, hp.digest())
    return ctx


def structure_only(hp: HParams) -> Decoder:
    """The model's structure, without memory for its parameters (meta device)."""
    with torch.device("meta"):
        return Decoder(hp.model)


def _metrics(cfg: Config, role: str) -> NodeMetrics | None:
    """The node's Prometheus endpoint, started first so a scraper sees it through the whole start-up."""
    port, host = cfg.neuron.metrics_port, cfg.neuron.metrics_host
    if not port:
        return None
    try:
        return start_metrics(role, host, port)
    except OSError as e:
        raise Fatal(f"cannot serve metrics on {host}:{port}: {e.strerror or e} (choose another "
                    "--neuron.metrics_port, or 0 for none)") from None


def _attach_metrics(ctx: NodeContext, metrics: NodeMetrics) -> None:
    """Metrics derive from the per-window records; the window's length comes from chain time."""
    def window_seconds(t: int) -> float | None:
        try:
            return ctx.clock.window_start(t + 1) - ctx.clock.window_start(t)
        except ChainError:
            return None

    metrics.node(ctx.role, ctx.uid, ctx.hp.digest())
    metrics.window_seconds = window_seconds
    ctx.events.listeners.append(metrics.observe)


def _open_chain(cfg: Config) -> Chain:
    try:
        chain = open_chain(cfg)
        chain.block()
        return chain
    except ChainUnavailable as e:
        raise Fatal(str(e)) from None
    except ChainError as e:
        raise Fatal(f"chain {cfg.subtensor.network!r} unreachable: {e}") from None


def leader_idle_blocks(cfg: Config) -> int:
    """A validator that posted no weights for this many blocks no longer leads: two posting intervals
    (``windows_per_weights`` windows; it posts a heartbeat when nobody has earned weight yet) and a window."""
    return (2 * cfg.hparams.windows_per_weights + 1) * cfg.hparams.blocks_per_window


def _own_bucket(cfg: Config, chain: Chain, wallet: Any, hotkey: str, uid: int, role: str) -> OwnBucket:
    """Our bucket (created if needed) and its read-only credentials published on chain (a validator's
    commitment carries the role tag)."""
    st = cfg.storage
    key = st.access_key_id or os.environ.get("AWS_ACCESS_KEY_ID", "")
    secret = st.secret_access_key or os.environ.get("AWS_SECRET_ACCESS_KEY", "")
    read_key = st.read_access_key_id or os.environ.get("DSO_READ_ACCESS_KEY_ID", "")
    read_secret = st.read_secret_access_key or os.environ.get("DSO_READ_SECRET_ACCESS_KEY", "")
    if not (key and secret and read_key and read_secret):
        raise Fatal("storage credentials missing: pass --storage.access_key_id/--storage.secret_access_key "
                    "(or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY) and the read-only pair "
                    "--storage.read_access_key_id/--storage.read_secret_access_key")
    bucket = st.bucket or f"dso-{hotkey[:16].lower()}"
    client = S3Client(st.endpoint or None, st.region, key, secret, timeout=st.timeout_seconds)
    try:
        client.ensure_bucket(bucket)
    except StorageError as e:
        hint = (" — is the local network running? start it with `python scripts/localnet.py`"
                if e.kind == "unavailable" else "")
        raise Fatal(f"cannot use bucket {bucket} at {st.endpoint}: {e}{hint}") from None
    try:
        commitment = format_commitment(BucketInfo(st.public_endpoint or st.endpoint, st.region, bucket, read_key,
                                                  read_secret))
    except ValueError as e:  # e.g. a --storage.public_endpoint that is not a URL
        raise Fatal(f"{e} (--storage.public_endpoint / --storage.endpoint, --storage.region, the read key)") from None
    if role == "validator":
        commitment = with_role(commitment, VALIDATOR)
    try:
        if chain.commitment(uid) != commitment:
            chain.commit(wallet, commitment)
    except ChainError as e:
        raise Fatal(f"cannot publish the bucket's read credentials on chain: {e}") from None
    return OwnBucket(client, bucket)
