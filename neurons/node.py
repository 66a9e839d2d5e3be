"""What a miner and a validator share: start-up, identity, bucket, peers, the run manifest, logging.

Start-up order: config → chain (a missing local network ends the process with
one line saying how to start it) → wallet → registration → own bucket and its
published read credentials → data (pinned by hash) → θ_0 and the codec.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import torch

from dso.chain import ChainError, ChainUnavailable
from dso.chain.factory import open_chain
from dso.chain.wallets import WalletError, hotkey_address, load_wallet
from dso.clock import Clock
from dso.config import Config, HParams, expand
from dso.data import DataError, Dataset
from dso.model import build_model, parameter_shapes
from dso.rejections import Rejection
from dso.sketch import make_codec
from storage import keys
from storage.client import S3Client, StorageError
from storage.commitment import BucketInfo, format_commitment, parse_commitment
from storage.gather import ReaderCache
from storage.jsonobj import get_json, put_json

log = logging.getLogger("dso")


class Fatal(SystemExit):
    """Stop the process with one clear line (exit code 1)."""

    def __init__(self, message: str):
        super().__init__(1)
        self.message = message


def run_main(main) -> None:
    """Run a node's main(); Fatal prints its one line instead of a traceback."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    try:
        sys.exit(main())
    except Fatal as e:
        print(f"{Path(sys.argv[0]).stem}: {e.message}", file=sys.stderr)
        sys.exit(1)


class StopFlag:
    """Set by SIGINT/SIGTERM; long waits poll it so the process stops within a fraction of a second."""

    def __init__(self) -> None:
        self._event = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        if self._event.is_set():  # second signal: stop now
            raise KeyboardInterrupt
        log.info("signal %s: finishing the current step, then stopping", signal.Signals(signum).name)
        self._event.set()

    def __call__(self) -> bool:
        return self._event.is_set()

    def sleep(self, seconds: float) -> bool:
        """Sleep unless stopped; True when the full time passed."""
        return not self._event.wait(max(0.0, seconds))


def manifest(hp: HParams, data_hash: str) -> dict:
    return {"version": hp.protocol_version, "hparams_digest": hp.digest(), "data_hash": data_hash,
            "hparams": asdict(hp)}


def manifest_problem(mine: dict, theirs: dict | Rejection) -> str | None:
    """Why this node must not join the run described by ``theirs`` (None = agree)."""
    if isinstance(theirs, Rejection):
        return None  # no manifest yet: nothing to disagree with
    if theirs.get("data_hash") and theirs.get("data_hash") != mine["data_hash"]:
        return (f"data hash {mine['data_hash'][:12]}… differs from the run's {str(theirs['data_hash'])[:12]}…: "
                "use the same corpus as the validator")
    if theirs.get("hparams_digest") != mine["hparams_digest"]:
        ours, other = mine["hparams"], theirs.get("hparams") if isinstance(theirs.get("hparams"), dict) else {}
        diff = _diff(ours, other)
        return f"hyper-parameters differ from the run's ({'; '.join(diff[:6]) or 'digest mismatch'})"
    return None


def _diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _diff(x, y, f"{prefix}{key}.")
        elif x != y:
            out.append(f"hparams.{prefix}{key}: ours {x!r}, run {y!r}")
    return out


class Node:
    """One network participant's connections and shared state."""

    role = "node"

    def __init__(self, cfg: Config):
        self.cfg, self.hp = cfg, cfg.hparams
        torch.set_num_threads(cfg.threads)
        self.device = torch.device(cfg.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise Fatal("--device cuda asked for, but torch sees no CUDA device")
        self.stop = StopFlag()
        self.chain = self._open_chain()
        try:
            self.wallet = load_wallet(cfg.wallet)
        except WalletError as e:
            raise Fatal(str(e)) from None
        self.hotkey = hotkey_address(self.wallet)
        try:
            self.uid = self.chain.register(self.wallet)
        except ChainError as e:
            raise Fatal(f"registration refused: {e}") from None
        self.clock = Clock(self.chain, self.hp.blocks_per_window, self.hp.put_window_seconds)
        self.client = self._own_bucket()
        self.readers = ReaderCache(timeout=cfg.storage.timeout_seconds)
        try:
            self.dataset = Dataset.from_config(cfg.data.corpus, cfg.data.cache_dir, self.hp.model.seq_len,
                                               self.hp.seed, self.hp.val_fraction, self.hp.data_hash)
        except DataError as e:
            raise Fatal(str(e)) from None
        self.model = build_model(self.hp.model, self.hp.seed, self.device)
        self.shapes = parameter_shapes(self.model)
        self.codec = make_codec(self.shapes, self.hp)
        self.manifest = manifest(self.hp, self.dataset.data_hash)
        self.state_dir = expand(cfg.neuron.state_dir) / f"{cfg.wallet.name}-{cfg.wallet.hotkey}" / self.role
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._json_log = open(expand(cfg.neuron.log_json), "a") if cfg.neuron.log_json else None
        log.info("%s uid %d hotkey %s… bucket %s, data %s…, hparams %s", self.role, self.uid, self.hotkey[:8],
                 self.bucket, self.dataset.data_hash[:10], self.hp.digest())

    # ------------------------------------------------------------ start-up
    def _open_chain(self):
        try:
            chain = open_chain(self.cfg)
            chain.block()
            return chain
        except ChainUnavailable as e:
            raise Fatal(str(e)) from None
        except ChainError as e:
            raise Fatal(f"chain {self.cfg.subtensor.network!r} unreachable: {e}") from None

    def _own_bucket(self) -> S3Client:
        st = self.cfg.storage
        key = st.access_key_id or os.environ.get("AWS_ACCESS_KEY_ID", "")
        secret = st.secret_access_key or os.environ.get("AWS_SECRET_ACCESS_KEY", "")
        read_key = st.read_access_key_id or os.environ.get("DSO_READ_ACCESS_KEY_ID", "")
        read_secret = st.read_secret_access_key or os.environ.get("DSO_READ_SECRET_ACCESS_KEY", "")
        if not (key and secret and read_key and read_secret):
            raise Fatal("storage credentials missing: pass --storage.access_key_id/--storage.secret_access_key "
                        "(or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY) and the read-only pair "
                        "--storage.read_access_key_id/--storage.read_secret_access_key")
        self.bucket = st.bucket or f"dso-{self.hotkey[:16].lower()}"
        client = S3Client(st.endpoint or None, st.region, key, secret, timeout=st.timeout_seconds)
        try:
            client.ensure_bucket(self.bucket)
        except StorageError as e:
            hint = (" — is the local network running? start it with `python scripts/localnet.py`"
                    if e.kind == "unavailable" else "")
            raise Fatal(f"cannot use bucket {self.bucket} at {st.endpoint}: {e}{hint}") from None
        info = BucketInfo(st.endpoint, st.region, self.bucket, read_key, read_secret)
        commitment = format_commitment(info)
        try:
            if self.chain.commitment(self.uid) != commitment:
                self.chain.commit(self.wallet, commitment)
        except ChainError as e:
            raise Fatal(f"cannot publish the bucket's read credentials on chain: {e}") from None
        return client

    # ------------------------------------------------------------- peers
    def buckets(self) -> dict[int, str | None]:
        """uid → raw commitment (parsed and validated by whoever reads it)."""
        commitments = self.chain.commitments()
        return {n.uid: commitments.get(n.uid) for n in self.chain.metagraph()}

    def reader(self, uid: int) -> tuple[S3Client, str] | Rejection:
        info = parse_commitment(self.chain.commitment(uid))
        if isinstance(info, Rejection):
            return info
        return self.readers.get(info), info.bucket

    def leader_uid(self) -> int | None:
        lead = self.chain.leading_validator()
        return lead.uid if lead else None

    def leader(self) -> tuple[S3Client, str] | Rejection | None:
        uid = self.leader_uid()
        if uid is None:
            return None
        return (self.client, self.bucket) if uid == self.uid else self.reader(uid)

    def check_manifest(self) -> None:
        """Refuse to run with other protocol settings or data than the leading validator's run."""
        lead = self.leader()
        if lead is None or isinstance(lead, Rejection):
            return
        client, bucket = lead
        theirs = get_json(client, bucket, keys.manifest(self.hp.protocol_version))
        problem = manifest_problem(self.manifest, theirs)
        if problem:
            raise Fatal(f"refusing to run: {problem}")

    def publish_manifest(self) -> None:
        put_json(self.client, self.bucket, keys.manifest(self.hp.protocol_version), self.manifest)

    # ------------------------------------------------------------- output
    def emit(self, record: dict) -> None:
        """One JSON line per window (for the localnet's live view and reports)."""
        if self._json_log:
            record = {"role": self.role, "uid": self.uid, "time": time.time(), **record}
            self._json_log.write(json.dumps(record) + "\n")
            self._json_log.flush()

    def wait_randomness(self, window: int, timeout: float = 5.0) -> bytes | None:
        """Chain randomness of the window (available once its put window has opened)."""
        deadline = time.time() + timeout
        while True:
            try:
                return self.clock.window_randomness(window)
            except ChainError:
                if time.time() > deadline or not self.stop.sleep(0.1):
                    return None
