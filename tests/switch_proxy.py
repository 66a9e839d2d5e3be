"""A TCP relay in front of an S3 endpoint that a test can switch off and on: while off, every connection
(new or open) is cut, as when a network path or the server goes away.  Requests pass through byte for
byte, so SigV4 signatures still verify at the real server."""
from __future__ import annotations

import socket
import threading
from urllib.parse import urlsplit


class SwitchProxy:
    def __init__(self, upstream: str):
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._on = threading.Event()
        self._on.set()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self.refused = 0
        threading.Thread(target=self._accept, daemon=True, name="switch-proxy").start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def down(self) -> None:
        self._on.clear()
        with self._lock:
            for s in self._open:
                _close(s)
            self._open.clear()

    def up(self) -> None:
        self._on.set()

    def close(self) -> None:
        self.down()
        _close(self._listener)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._on.is_set():
                self.refused += 1
                _close(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._open.update((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                _close(s)
            with self._lock:
                self._open.discard(src)
                self._open.discard(dst)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
