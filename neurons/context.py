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
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable

import torch

from dso.chain import Chain, ChainError, ChainUnavailable
from dso.chain.factory import open_chain
from dso.chain.wallets import WalletError, hotkey_address, load_wallet
from dso.clock import Clock
from dso.codecs import Codec, Shapes, make_codec
from dso.config import Config, HParams, expand
from dso.data import DataError, Dataset
from dso.model import Decoder, build_model, parameter_shapes
from dso.rejections import Rejection
from neurons.lifecycle import Fatal, StopFlag
from neurons.manifest import manifest, manifest_problem
from neurons.metered_chain import MeteredChain
from neurons.metrics import NodeMetrics, bytes_per_token, start_metrics
from storage import keys
from storage.client import S3Client, StorageError
from storage.commitment import BucketInfo, format_commitment, parse_commitment
from storage.gather import ReaderCache
from storage.jsonobj import get_json, put_json

log = logging.getLogger("dso")
Source = tuple[S3Client, str]  # a client and the bucket it reads


@dataclass(frozen=True)
class OwnBucket:
    client: S3Client
    bucket: str


class PeerDirectory:
    """Who the other nodes are and how to read them: commitments → read-only clients, and the leader."""

    def __init__(self, chain: Chain, readers: ReaderCache, uid: int, own: OwnBucket):
        self.chain, self.readers, self.uid, self.own = chain, readers, uid, own

    def commitments(self) -> dict[int, str | None]:
        """uid → raw commitment of every registered uid (parsed and validated by whoever reads it)."""
        published = self.chain.commitments()
        return {n.uid: published.get(n.uid) for n in self.chain.metagraph()}

    def miners(self) -> dict[int, str]:
        """uid → hotkey of every registered peer that is not a validator (permit holder) or ourselves."""
        return {n.uid: n.hotkey for n in self.chain.metagraph() if n.uid != self.uid and not n.validator_permit}

    def reader(self, uid: int) -> Source | Rejection:
        info = parse_commitment(self.chain.commitment(uid))
        if isinstance(info, Rejection):
            return info
        return self.readers.get(info), info.bucket

    def leader_uid(self) -> int | None:
        lead = self.chain.leading_validator()
        return lead.uid if lead else None

    def leader(self) -> Source | Rejection | None:
        """Where the leading validator's objects are (None: no validator yet)."""
        uid = self.leader_uid()
        if uid is None:
            return None
        return (self.own.client, self.own.bucket) if uid == self.uid else self.reader(uid)


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
    """A node's connections and shared state.  ``model`` holds the node's θ."""

    cfg: Config
    role: str
    device: torch.device
    stop: StopFlag
    chain: Chain
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
    manifest: dict[str, Any]
    state_dir: Path
    events: EventLog
    metrics: NodeMetrics | None = None  # served on --neuron.metrics_port (None: off)

    @property
    def hp(self) -> HParams:
        return self.cfg.hparams

    @property
    def shapes(self) -> Shapes:
        return self.codec.shapes

    def check_manifest(self) -> None:
        """Refuse to run with other protocol settings or data than the leading validator's run."""
        lead = self.peers.leader()
        if lead is None or isinstance(lead, Rejection):
            return
        theirs = get_json(*lead, keys.manifest(self.hp.protocol_version))
        problem = manifest_problem(self.manifest, theirs)
        if problem:
            raise Fatal(f"refusing to run: {problem}")

    def publish_manifest(self) -> None:
        put_json(self.own.client, self.own.bucket, keys.manifest(self.hp.protocol_version), self.manifest)

    def wait_randomness(self, window: int, timeout: float = 5.0) -> bytes | None:
        """Chain randomness of the window (available once its put window has opened)."""
        deadline = time.time() + timeout
        while True:
            try:
                return self.clock.window_randomness(window)
            except ChainError:
                if time.time() > deadline or not self.stop.sleep(0.1):
                    return None


def build_context(cfg: Config, role: str, handle_signals: bool = True) -> NodeContext:
    """Wire a node; any problem ends the process with one line (:class:`Fatal`).  ``handle_signals``: SIGINT
    and SIGTERM stop the node after its current step (off when a node is embedded in another program)."""
    hp = cfg.hparams
    torch.set_num_threads(cfg.threads)
    device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise Fatal("--device cuda asked for, but torch sees no CUDA device")
    stop = StopFlag(install_handlers=handle_signals)
    metrics = _metrics(cfg, role)
    chain = _open_chain(cfg)
    if metrics is not None:  # chain writes show in the metrics; the node's code sees the same Chain
        chain = MeteredChain(chain, metrics.chain_write)
    try:
        wallet = load_wallet(cfg.wallet)
    except WalletError as e:
        raise Fatal(str(e)) from None
    hotkey = hotkey_address(wallet)
    try:
        uid = chain.register(wallet)
    except ChainError as e:
        raise Fatal(f"registration refused: {e}") from None
    own = _own_bucket(cfg, chain, wallet, hotkey, uid)
    readers = ReaderCache(timeout=cfg.storage.timeout_seconds)
    try:
        dataset = Dataset.from_config(cfg.data.corpus, cfg.data.cache_dir, hp.model.seq_len, hp.seed,
                                      hp.val_fraction, hp.data_hash)
    except DataError as e:
        raise Fatal(str(e)) from None
    model = build_model(hp.model, hp.seed, device)
    state_dir = expand(cfg.neuron.state_dir) / f"{cfg.wallet.name}-{cfg.wallet.hotkey}" / role
    state_dir.mkdir(parents=True, exist_ok=True)
    ctx = NodeContext(cfg=cfg, role=role, device=device, stop=stop, chain=chain,
                      clock=Clock(chain, hp.blocks_per_window, hp.put_window_seconds), wallet=wallet, hotkey=hotkey,
                      uid=uid, own=own, peers=PeerDirectory(chain, readers, uid, own), readers=readers,
                      dataset=dataset, model=model, codec=make_codec(parameter_shapes(model), hp),
                      manifest=manifest(hp, dataset.data_hash), state_dir=state_dir,
                      events=EventLog(cfg.neuron.log_json, role, uid), metrics=metrics)
    if metrics is not None:
        _attach_metrics(ctx, metrics)
    log.info("%s uid %d hotkey %s… bucket %s, data %s…, hparams %s", role, uid, hotkey[:8], own.bucket,
             dataset.data_hash[:10], hp.digest())
    return ctx


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
    metrics.bytes_per_token = bytes_per_token(ctx.dataset)
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


def _own_bucket(cfg: Config, chain: Chain, wallet: Any, hotkey: str, uid: int) -> OwnBucket:
    """Our bucket (created if needed) and its read-only credentials published on chain."""
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
    commitment = format_commitment(BucketInfo(st.endpoint, st.region, bucket, read_key, read_secret))
    try:
        if chain.commitment(uid) != commitment:
            chain.commit(wallet, commitment)
    except ChainError as e:
        raise Fatal(f"cannot publish the bucket's read credentials on chain: {e}") from None
    return OwnBucket(client, bucket)
