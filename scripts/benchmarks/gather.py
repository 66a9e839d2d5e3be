"""Gather section: time to gather K default-model payloads from the embedded S3 server (IAM auth on).

Each of K peers has its own bucket and read-only key (as on a real network); every payload is a
default-model DeMo update with the configured sync samples.  The number is the median wall time of
a full :func:`storage.gather.gather` (HEAD + GET + strict decode of every peer) with warm client
caches, i.e. what a validator pays every window.  Also reported: the strict decode of one payload
alone (times K, the share of the gather spent decoding) and the log-log slope of time against K
(1 = linear).  Standalone: ``python scripts/benchmarks/gather.py [--ks 8 32 128] [--repeats 3]``.

``hostile``: 32 honest peers gathered with 0, 16 and 64 hostile endpoints beside them —
``stalled`` (accept TCP, never answer) or ``drip`` (one byte every 0.5 s) — placed *before* the honest
uids, with the validator's priority order (honest peers by last-window standing) and, for the worst
case, without it.  Reported per row: ``honest_seconds`` (when the last honest payload was in hand),
``seconds`` (the whole call: it waits for the impostors' fair shares of the budget to run out),
``honest_ok`` (every honest payload gathered, byte-identical to the clean run) and the ratio of
``honest_seconds`` to the clean case; target ≤ 1.5 with priority.

``hostile_look``: the validator's watch and look (storage/look.py) beside 64 endpoints that never
answer, on lower uids than 32 honest peers whose signatures go up over 1.5 s of a 2.5 s put window: per window,
the share of honest uploads whose first sight the watch observed (target: all of them, every window, in the
validator's order), the share the look saw at the close, and how long after an upload its first sight came —
with the validator's order and with none (uid order; the silent peers go last from the next round on).
Standalone: ``python scripts/benchmarks/gather.py --look``.

Quick mode: K = 8 and 32 once; the hostile rows with 0 and 64 endpoints under a 4 s deadline; one look window per
order.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import threading
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository and scripts/ onto the path
    sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[1])]

import torch  # noqa: E402

from benchmarks import hostile_server  # noqa: E402
from benchmarks.common import proc_cpu_seconds  # noqa: E402
from dso.codec.demo import DeMoCodec  # noqa: E402
from dso.config.schema import HParams  # noqa: E402
from dso.nn.model import build_model, parameter_shapes, sync_sample_count  # noqa: E402
from dso.protocol.payload import PayloadMeta
from storage import keys, signature  # noqa: E402
from storage.commitment import BucketInfo  # noqa: E402
from storage.gather import GatherOptions, ReaderCache, gather  # noqa: E402
from storage.look import look, speakers_first, watch  # noqa: E402
from storage.server import EmbeddedS3  # noqa: E402
from storage.wire import Expect, decode_payload, encode_payload  # noqa: E402

WINDOW = 1


def scaling_exponent(points: list[dict]) -> float | None:
    """Least-squares slope of log(seconds) against log(peers): 1 = linear, < 1 = better than linear."""
    pts = [(math.log(p["peers"]), math.log(p["seconds"])) for p in points if p["peers"] > 0 and p["seconds"] > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    var = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / var if var else None


def _server_cpu(server) -> float | None:
    """CPU seconds of the embedded S3 server process so far (None when it is not a child of ours)."""
    process = getattr(server, "_process", None)  # a benchmark-only peek: tells server from client cost
    return proc_cpu_seconds(process.pid) if process is not None else None


def bench_gather(ks=(8, 32, 128), repeats: int = 3, deadline_seconds: float = 120.0) -> dict:
    """{"points": [{"peers": K, "seconds": median gather time}], "decode_ms": one payload's strict decode}."""
    torch.set_num_threads(1)
    hp = HParams()
    model = build_model(hp.model, hp.seed)
    codec = DeMoCodec.from_hparams(parameter_shapes(model), hp)
    gen = torch.Generator().manual_seed(0)
    update = codec.compress({n: torch.randn(p.shape, generator=gen) for n, p in model.named_parameters()}, 0)
    sync = torch.randn(sync_sample_count(hp), generator=gen)
    expect = Expect.from_hparams(hp, WINDOW)
    points = []
    with EmbeddedS3.start() as server:
        commitments = {}
        for uid in range(max(ks)):
            creds = server.provision(f"bench{uid}")
            meta = PayloadMeta(uid, WINDOW, hp.protocol_version, hp.digest())
            blob = encode_payload(codec, update, sync, meta)
            creds.write_client().put(creds.bucket, keys.gradient(WINDOW, uid, hp.protocol_version), blob)
            commitments[uid] = creds.commitment()
        readers = ReaderCache(allow_loopback=True)
        for k in ks:
            peers = {uid: commitments[uid] for uid in range(k)}
            times, client_cpu, server_cpu = [], [], []
            for attempt in range(repeats + 1):  # the first run builds the read clients: not counted
                cpu_before, server_before = time.process_time(), _server_cpu(server)
                result = gather(WINDOW, peers, codec, expect, None, deadline_seconds, GatherOptions(readers=readers))
                cpu_after, server_after = time.process_time(), _server_cpu(server)
                if len(result.payloads) != k:
                    raise RuntimeError(f"bench gather lost peers: {dict(list(result.rejections.items())[:3])}")
                if attempt:
                    times.append(result.seconds)
                    client_cpu.append(cpu_after - cpu_before)
                    if server_before is not None and server_after is not None:
                        server_cpu.append(server_after - server_before)
            point = {"peers": k, "seconds": statistics.median(times),
                     "client_cpu_seconds": statistics.median(client_cpu)}
            if server_cpu:
                point["server_cpu_seconds"] = statistics.median(server_cpu)
            points.append(point)
    decode_times = []
    for _ in range(max(3, repeats)):
        start = time.perf_counter()
        decode_payload(blob, codec, expect.for_uid(max(ks) - 1))
        decode_times.append((time.perf_counter() - start) * 1000)
    return {"points": points, "payload_bytes": len(blob), "decode_ms": statistics.median(decode_times)}


HOSTILE_COUNTS = (0, 16, 64)
HONEST_UIDS = range(1000, 1032)


def _hostile_row(readers, codec, expect, honest: dict, clean: dict | None, hostile: int, kind: str,
                 priority: bool, deadline_seconds: float, body_bytes: int) -> dict:
    process, ports = hostile_server.start("stall" if kind == "stalled" else "drip", hostile, body_bytes) \
        if hostile else (None, [])
    try:
        impostors = {uid: BucketInfo(f"http://127.0.0.1:{port}", "us-east-1", "dso-evil", "AKIAEVIL", "s" * 40)
                     for uid, port in enumerate(ports)}
        result = gather(WINDOW, {**impostors, **honest}, codec, expect, None, deadline_seconds,
                        GatherOptions(readers=readers, priority=list(honest) if priority else None))
    finally:
        if process is not None:
            hostile_server.stop(process)
    got = {uid: (p.nbytes, p.sync_values.tolist()) for uid, p in result.payloads.items() if uid in honest}
    ok = sorted(got) == sorted(honest) and (clean is None or got == clean)
    honest_seconds = max((result.finished.get(uid, result.seconds) for uid in honest), default=0.0)
    return {"hostile": hostile, "kind": kind, "priority": priority, "honest_seconds": honest_seconds,
            "seconds": result.seconds, "honest_ok": ok, "_payloads": got,
            "hostile_rejections": sorted({r.reason.value for u, r in result.rejections.items() if u in impostors})}


def bench_hostile(repeats: int = 3, deadline_seconds: float = 8.0, counts: tuple[int, ...] = HOSTILE_COUNTS) -> dict:
    """Rows of {hostile, kind, priority, honest_seconds, seconds, honest_ok, ratio} (medians over repeats), with
    0 and each of ``counts`` hostile endpoints."""
    torch.set_num_threads(1)
    hp = HParams()
    model = build_model(hp.model, hp.seed)
    codec = DeMoCodec.from_hparams(parameter_shapes(model), hp)
    gen = torch.Generator().manual_seed(1)
    expect = Expect.from_hparams(hp, WINDOW)
    rows = []
    with EmbeddedS3.start() as server:
        honest = {}
        for uid in HONEST_UIDS:
            creds = server.provision(f"honest{uid}")
            update = codec.compress({n: torch.randn(p.shape, generator=gen) for n, p in model.named_parameters()},
                                    WINDOW)
            blob = encode_payload(codec, update, torch.randn(hp.sync_samples, generator=gen),
                                  PayloadMeta(uid, WINDOW, hp.protocol_version, hp.digest()))
            creds.write_client().put(creds.bucket, keys.gradient(WINDOW, uid, hp.protocol_version), blob)
            honest[uid] = creds.commitment()
        readers = ReaderCache(allow_loopback=True)
        body = len(blob)  # a drip announces a plausible payload size, under the cap
        warm = _hostile_row(readers, codec, expect, honest, None, 0, "stalled", True, deadline_seconds, body)
        clean = warm["_payloads"]
        plan = [(0, "none", True)] + [(h, kind, True) for h in counts if h for kind in ("stalled", "drip")] \
            + [(max(counts), "stalled", False)]
        for hostile, kind, priority in plan:
            runs = [_hostile_row(readers, codec, expect, honest, clean, hostile, kind, priority, deadline_seconds,
                                 body) for _ in range(repeats)]
            row = {k: v for k, v in runs[0].items() if k != "_payloads"}
            row["honest_seconds"] = statistics.median(r["honest_seconds"] for r in runs)
            row["seconds"] = statistics.median(r["seconds"] for r in runs)
            row["honest_ok"] = all(r["honest_ok"] for r in runs)
            rows.append(row)
    base = rows[0]["honest_seconds"]
    for row in rows:
        row["ratio"] = row["honest_seconds"] / base if base > 0 else None
    worst = max((r["ratio"] for r in rows if r["priority"] and r["ratio"] is not None), default=None)
    return {"rows": rows, "honest": len(HONEST_UIDS), "deadline_seconds": deadline_seconds,
            "worst_ratio_with_priority": worst, "all_honest_ok": all(r["honest_ok"] for r in rows)}


LOOK_WINDOWS = 4
LOOK_PUT_SECONDS = 2.5


def _publish_signatures(creds: dict, hp: HParams, window: int, times: dict[int, float], done: dict[int, float]) -> None:
    """Each honest peer puts a signature object of ``window`` at its time (what a miner publishes first)."""
    for uid in sorted(times, key=times.__getitem__):
        time.sleep(max(0.0, times[uid] - time.time()))
        sig = "ab" * 64  # the look and the watch read the object, they do not verify it
        signature.put(creds[uid].write_client(), creds[uid].bucket, "", window, uid, hp.protocol_version, "0" * 64, sig)
        done[uid] = time.time()


def bench_look(windows: int = LOOK_WINDOWS, tarpits: int = 64) -> dict:
    """The validator's watch (while uploads are open) and look (at the close) beside ``tarpits`` endpoints that
    never answer, on lower uids than the honest peers: per window, the share of honest uploads whose first sight
    the watch observed, the share the look saw, and how long after an upload its first sight came.  Two orders:
    the validator's (honest peers by standing first) and none at all (uid order: only the demotion of silent
    peers helps), each over ``windows`` windows with the silent set carried from window to window."""
    hp = HParams()
    rows = []
    process, ports = hostile_server.start("stall", tarpits, 0)
    try:
        with EmbeddedS3.start() as server:
            creds = {uid: server.provision(f"look{uid}") for uid in HONEST_UIDS}
            impostors = {uid: BucketInfo(f"http://127.0.0.1:{port}", "us-east-1", "dso-evil", "AKIAEVIL", "s" * 40)
                         for uid, port in enumerate(ports)}
            peers: dict[int, BucketInfo | str | None] = {**impostors, **{u: c.commitment() for u, c in creds.items()}}
            readers = ReaderCache(allow_loopback=True)
            for priority in (True, False):
                silent: set[int] = set()
                for w in range(windows):
                    rows.append(_look_row(hp, creds, peers, readers, silent, 10 * (2 + int(priority)) + w,
                                          list(HONEST_UIDS) if priority else None))
    finally:
        hostile_server.stop(process)
    worst = {p: min(r["watch_observed"] for r in rows if r["priority"] == p) for p in (True, False)}
    return {"rows": rows, "tarpits": tarpits, "honest": len(HONEST_UIDS),
            "observed_with_priority": worst[True], "observed_without_priority": worst[False],
            "look_seen": min(r["look_seen"] for r in rows)}


def _look_row(hp: HParams, creds: dict, peers: dict, readers: ReaderCache, silent: set[int], window: int,
              priority: list[int] | None) -> dict:
    expect = Expect.from_hparams(hp, window)
    opened = time.time() + 0.3
    close = opened + LOOK_PUT_SECONDS
    times = {uid: opened + 1.5 * i / len(creds) for i, uid in enumerate(sorted(creds))}  # spread over 1.5 s
    done: dict[int, float] = {}
    publisher = threading.Thread(target=_publish_signatures, args=(creds, hp, window, times, done))
    publisher.start()
    time.sleep(max(0.0, opened - time.time()))
    first = watch(window, peers, expect, close, readers=readers, priority=priority, silent=silent)
    publisher.join()
    time.sleep(max(0.0, close + 0.3 - time.time()))
    found = look(window, peers, expect, close, readers=readers, priority=speakers_first(peers, priority, silent))
    honest = sorted(creds)
    lag = [first[u].answered - done[u] for u in honest if u in first and u in done]
    return {"window": window, "priority": priority is not None,
            "watch_observed": sum(u in first for u in honest) / len(honest),
            "look_seen": sum(u in found.seen for u in honest) / len(honest),
            "first_sight_lag_max": round(max(lag), 3) if lag else None,
            "first_sight_lag_median": round(statistics.median(lag), 3) if lag else None,
            "silent_after": len(silent)}


def summarise(points: list[dict], decode_ms: float) -> list[dict]:
    """Adds seconds per peer and the share of the gather a strict decode of every payload accounts for."""
    out = []
    for p in points:
        row = {**p, "seconds_per_peer": p["seconds"] / p["peers"],
               "decode_share": decode_ms / 1000 * p["peers"] / p["seconds"]}
        if "client_cpu_seconds" in p and "server_cpu_seconds" in p:  # 2.0 = both cores busy the whole time
            row["cores_busy"] = (p["client_cpu_seconds"] + p["server_cpu_seconds"]) / p["seconds"]
        out.append(row)
    return out


def run(quick: bool) -> dict:
    res = bench_gather(ks=(8, 32) if quick else (8, 32, 128), repeats=1 if quick else 5)
    points = summarise(res.pop("points"), res["decode_ms"])
    # quick: the calls that wait out the deadline are most of the section's time, so fewer and shorter ones
    hostile = bench_hostile(1, 4.0, (0, 64)) if quick else bench_hostile(3)
    looked = bench_look(windows=1 if quick else LOOK_WINDOWS)
    return {"gather": points, "scaling_exponent": scaling_exponent(points), **res, "hostile": hostile["rows"],
            "hostile_worst_ratio": hostile["worst_ratio_with_priority"],
            "hostile_honest_ok": 1.0 if hostile["all_honest_ok"] else 0.0,
            "hostile_look": looked["rows"], "hostile_look_observed": looked["observed_with_priority"],
            "hostile_look_observed_without_priority": looked["observed_without_priority"],
            "hostile_look_seen": looked["look_seen"]}


def markdown(result: dict) -> str:
    lines = ["| peers K | seconds | ms per peer | share spent in strict decode | cores busy (client + S3 server) |",
             "|---:|---:|---:|---:|---:|"]
    for p in result["gather"]:
        busy = f"{p['cores_busy']:.2f}" if "cores_busy" in p else "—"
        lines.append(f"| {p['peers']} | {p['seconds']:.2f} | {1000 * p['seconds_per_peer']:.1f} | "
                     f"{p['decode_share']:.0%} | {busy} |")
    if result.get("hostile"):
        lines += ["", "| hostile peers | kind | honest first | honest done (s) | whole call (s) | honest ok | "
                      "ratio to clean |", "|---:|---|:---:|---:|---:|:---:|---:|"]
        for r in result["hostile"]:
            ratio = "—" if r.get("ratio") is None else f"{r['ratio']:.2f}"
            lines.append(f"| {r['hostile']} | {r['kind']} | {'yes' if r['priority'] else 'no'} | "
                         f"{r['honest_seconds']:.2f} | {r['seconds']:.2f} | {'yes' if r['honest_ok'] else '**no**'} | "
                         f"{ratio} |")
    if result.get("hostile_look"):
        lines += ["", "| look beside 64 tarpits: window | validator's order | first sight observed (watch) | "
                      "seen at the close | first sight after upload: median / max (s) |", "|---:|:---:|---:|---:|---:|"]
        for r in result["hostile_look"]:
            lag = "—" if r["first_sight_lag_max"] is None else \
                f"{r['first_sight_lag_median']:.2f} / {r['first_sight_lag_max']:.2f}"
            lines.append(f"| {r['window']} | {'yes' if r['priority'] else 'no'} | {r['watch_observed']:.0%} | "
                         f"{r['look_seen']:.0%} | {lag} |")
    slope = result["scaling_exponent"]
    lines += ["", f"log-log slope of time against K: {slope:.2f} (1 = linear)" if slope is not None else "",
              f"strict decode of one payload ({result['payload_bytes']} bytes): {result['decode_ms']:.1f} ms"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ks", type=int, nargs="+", default=[8, 32, 128])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hostile", action="store_true", help="only the hostile-endpoint rows")
    p.add_argument("--look", action="store_true", help="only the look and watch beside 64 tarpits")
    a = p.parse_args(argv)
    if a.look:
        print(json.dumps(bench_look(), indent=2))
        return 0
    print(json.dumps(bench_hostile(a.repeats) if a.hostile else bench_gather(tuple(a.ks), a.repeats), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
