#!/usr/bin/env python
"""Time to gather K default-model payloads from the embedded S3 server (IAM auth on).

    python scripts/bench_gather.py [--ks 8 32 128] [--repeats 3]

Each of K peers has its own bucket and read-only key (as on a real network);
every payload is a default-model DeMo update with the configured sync samples.
The reported number is the median wall time of a full :func:`storage.gather.gather`
(HEAD + GET + strict decode of every peer) with warm client caches, i.e. what a
validator pays every window.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dso.codec import DeMoCodec  # noqa: E402
from dso.config import HParams  # noqa: E402
from dso.model import build_model, parameter_shapes  # noqa: E402
from storage import keys  # noqa: E402
from storage.gather import ReaderCache, gather  # noqa: E402
from storage.server import EmbeddedS3  # noqa: E402
from storage.wire import Expect, PayloadMeta, encode_payload  # noqa: E402

WINDOW = 1


def bench_gather(ks=(8, 32, 128), repeats: int = 3, deadline_seconds: float = 120.0) -> list[dict]:
    """[{"peers": K, "seconds": median gather time}] for each K in ``ks``."""
    torch.set_num_threads(1)
    hp = HParams()
    model = build_model(hp.model, hp.seed)
    codec = DeMoCodec.from_hparams(parameter_shapes(model), hp)
    gen = torch.Generator().manual_seed(0)
    update = codec.compress({n: torch.randn(p.shape, generator=gen) for n, p in model.named_parameters()})
    sync = torch.randn(hp.sync_samples, generator=gen)
    out = []
    with EmbeddedS3.start() as server:
        commitments = {}
        for uid in range(max(ks)):
            creds = server.provision(f"bench{uid}")
            meta = PayloadMeta(uid, WINDOW, hp.protocol_version, hp.digest())
            creds.write_client().put(creds.bucket, keys.gradient(WINDOW, uid, hp.protocol_version),
                                     encode_payload(codec, update, sync, meta))
            commitments[uid] = creds.commitment()
        readers = ReaderCache()
        expect = Expect.from_hparams(hp, WINDOW)
        for k in ks:
            peers = {uid: commitments[uid] for uid in range(k)}
            times = []
            for attempt in range(repeats + 1):  # the first run builds the read clients: not counted
                result = gather(WINDOW, peers, codec, expect, None, deadline_seconds, readers=readers)
                if len(result.payloads) != k:
                    raise RuntimeError(f"bench gather lost peers: {dict(list(result.rejections.items())[:3])}")
                if attempt:
                    times.append(result.seconds)
            out.append({"peers": k, "seconds": statistics.median(times)})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ks", type=int, nargs="+", default=[8, 32, 128])
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    print(json.dumps(bench_gather(tuple(a.ks), a.repeats), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
