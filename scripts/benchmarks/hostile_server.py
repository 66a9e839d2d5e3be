"""Hostile S3 impostors in a child process, so their sockets and threads are not counted as the reader's.

    python hostile_server.py MODE COUNT [BODY_BYTES]   prints one JSON line: the ports, then serves until killed

Modes:
  stall  listens and never accepts: connections complete in the kernel, no byte ever comes back;
  drip   answers every request with a plausible 200 and a BODY_BYTES body (default 60,000; keep it under
         the reader's size cap), one byte every 0.5 s
         (headers at once, so HEAD passes and the GET hangs on the body);
  crawl  drips the status line and headers themselves, one byte every 0.5 s.
Used by tests/integration/storage/test_storage_fair_gather.py and the gather benchmark (``start`` below).
"""
from __future__ import annotations

import asyncio
import email.utils
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

BODY_BYTES = 60_000
DRIP_SECONDS = 0.5


def _head(length: int) -> bytes:
    return (f"HTTP/1.1 200 OK\r\nContent-Length: {length}\r\nETag: \"abc\"\r\n"
            f"Last-Modified: {email.utils.formatdate(time.time(), usegmt=True)}\r\n\r\n").encode()


async def _serve(mode: str, body_bytes: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            request = await reader.readuntil(b"\r\n\r\n")
            head = _head(body_bytes)
            if mode == "drip":
                writer.write(head)
                slow = b"" if request.startswith(b"HEAD") else b"\0" * body_bytes
            else:
                slow = head
            for i in range(len(slow)):
                writer.write(slow[i:i + 1])
                await writer.drain()
                await asyncio.sleep(DRIP_SECONDS)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def _main(mode: str, count: int, body_bytes: int) -> None:
    ports, keep = [], []
    for _ in range(count):
        if mode == "stall":
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen(64)
            keep.append(sock)
            ports.append(sock.getsockname()[1])
        else:
            server = await asyncio.start_server(lambda r, w: _serve(mode, body_bytes, r, w), "127.0.0.1", 0)
            keep.append(server)
            ports.append(server.sockets[0].getsockname()[1])
    print(json.dumps(ports), flush=True)
    while True:
        await asyncio.sleep(3600)


def start(mode: str, count: int, body_bytes: int = BODY_BYTES) -> tuple[subprocess.Popen, list[int]]:
    """Start ``count`` impostors of ``mode`` in a child process; returns (process, ports)."""
    process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), mode, str(count), str(body_bytes)],
                               stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    ports = json.loads(process.stdout.readline())
    return process, ports


def stop(process: subprocess.Popen) -> None:
    process.kill()
    process.wait()
    process.stdout.close()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else BODY_BYTES))
