"""A copier's own S3 endpoint that serves an author's update as its own, on demand, with the author's headers
(docs/scoring.md, "Authorship no endpoint can fake").  Experiments only: the core never imports it.

The copier publishes this server's URL on chain (as ``backdater`` publishes sim/forging_s3.py's).  Whatever a
reader asks for under the copier's uid, the server builds from the author's bucket at that moment:

* the **payload**: the author's latest payload of the window, decoded and re-encoded under the copier's uid;
* the **signature**: the copier's own signature of those bytes (a copy signed under its own key is still a
  copy: who signed the digest first is what decides);
* under commit-reveal, a **commitment** and a **reveal** that match the copy, with a nonce of its own, once
  the author has revealed.

Every answer carries the author's ETag and Last-Modified for the same kind of object (pinned).  Before the
author's objects exist, ``placeholder=True`` answers with well-formed placeholders (a commitment and a
signature of nothing, a HEAD with a fixed size and ETag), as an attacker holding an early place would;
``placeholder=False`` answers 404.  Requests are not authenticated: it is the copier's own server.
"""
from __future__ import annotations

import secrets
import threading
from dataclasses import replace
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from dso.codec.codecs import Codec
from dso.protocol import signatures
from dso.protocol.commit import commitment_hash
from dso.protocol.payload import Payload
from storage import keys, signature
from storage.client import ObjectInfo, StorageError
from storage.commitment import BucketInfo
from storage.endpoints import LOCAL
from storage.jsonobj import encode_json
from storage.peer_client import PeerClient
from storage.reveal import commit_object, reveal_object
from storage.wire import Expect, decode_payload, encode_payload

PINNED_ETAG = "0" * 32  # what a HEAD answers before anything exists (placeholder mode)
PINNED_SIZE = 4096


class CopyingS3:
    """Serve ``uid``'s objects as copies of ``author_uid``'s (read through ``author``) on a loopback port."""

    def __init__(self, author: BucketInfo, author_uid: int, uid: int, wallet: Any, codec: Codec, expect: Expect, *,
                 placeholder: bool = True, host: str = "127.0.0.1"):
        self.reader = PeerClient(author, LOCAL, timeout=5.0, max_attempts=1)
        self.author, self.author_uid, self.uid, self.wallet = author, author_uid, uid, wallet
        self.codec, self.expect, self.placeholder = codec, expect, placeholder
        self.nonces: dict[int, bytes] = {}
        self.copies: dict[int, tuple[bytes, ObjectInfo]] = {}  # window → our copy (made once) and the author's info
        self.signatures: dict[int, str] = {}                     # window → our signature of the copy
        self.served: dict[str, int] = {}   # answers by kind: what a test can check was asked for
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="copying-s3", daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host.decode() if isinstance(host, bytes) else host}:{port}"

    def __enter__(self) -> CopyingS3:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()

    # ---------------------------------------------------------------- copies
    def _author(self, key: str) -> tuple[bytes, ObjectInfo] | None:
        try:
            return self.reader.get_with_info(self.author.bucket, key, max_bytes=1 << 26)
        except StorageError:
            return None

    def payload(self, window: int) -> tuple[bytes, ObjectInfo] | None:
        """The author's payload of ``window`` re-encoded under our uid, with the author's object info; made once
        (safetensors writes metadata in no fixed order, so each encoding is other bytes)."""
        with self._lock:
            if window in self.copies:
                return self.copies[window]
        v, run = self.expect.protocol_version, self.expect.run
        got = self._author(keys.gradient(window, self.author_uid, v, run))
        if got is None:
            return None
        expect = replace(self.expect, window=window, uid=self.author_uid)
        decoded = decode_payload(got[0], self.codec, expect)
        if not isinstance(decoded, Payload):
            return None
        data = encode_payload(self.codec, decoded.update, decoded.sync_values, replace(decoded.meta, uid=self.uid))
        with self._lock:
            self.signatures[window] = signatures.sign_payload(self.wallet, run, window, self.uid, data)
            return self.copies.setdefault(window, (data, got[1]))

    def answer(self, key: str) -> tuple[bytes, ObjectInfo] | None:
        """The bytes and pinned headers for one of our keys (None: 404)."""
        parsed = keys.parse(key)
        if parsed is None or parsed.uid != self.uid:
            return None
        w, v, run = parsed.window, parsed.version, parsed.run
        copy = self.payload(w)
        author_key = {"gradient": keys.gradient, "signature": keys.signature, "commit": keys.commit,
                      "reveal": keys.reveal}.get(parsed.kind)
        pinned = self._author(author_key(w, self.author_uid, v, run)) if author_key else None
        info = pinned[1] if pinned else ObjectInfo(key, PINNED_SIZE, 0.0, PINNED_ETAG)
        if copy is None:
            return self._placeholder(parsed.kind, w, run, info) if self.placeholder else None
        data, nonce = copy[0], self.nonces.setdefault(w, secrets.token_bytes(32))
        if parsed.kind == "gradient":
            return data, copy[1]
        if parsed.kind == "signature":
            return signature.encode(run, w, self.uid, signatures.digest(data), self.signatures[w]), info
        if parsed.kind == "commit":
            return encode_json(commit_object(w, self.uid, commitment_hash(w, self.uid, data, nonce))), info
        if parsed.kind == "reveal":
            return encode_json(reveal_object(w, self.uid, nonce)), info
        return None

    def _placeholder(self, kind: str, w: int, run: str, info: ObjectInfo) -> tuple[bytes, ObjectInfo] | None:
        if kind == "signature":
            return signature.encode(run, w, self.uid, "0" * 64, "0" * signatures.SIGNATURE_HEX_CHARS), info
        if kind == "commit":
            return encode_json(commit_object(w, self.uid, "0" * 64)), info
        return None

    # ----------------------------------------------------------------- HTTP
    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self, with_body: bool) -> None:
                path = unquote(urlsplit(self.path).path).lstrip("/")
                key = path.split("/", 1)[1] if "/" in path else ""
                got = server.answer(key)
                parsed = keys.parse(key)
                kind = (parsed.kind if parsed else "other") if got else "missing"
                with server._lock:
                    server.served[kind] = server.served.get(kind, 0) + 1
                if got is None and not with_body and server.placeholder:  # an early HEAD: a pinned size and ETag
                    got = (b"\0" * PINNED_SIZE, ObjectInfo(key, PINNED_SIZE, 0.0, PINNED_ETAG))
                if got is None:
                    body = b"<Error><Code>NoSuchKey</Code></Error>"
                    self.send_response(404)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    if with_body:
                        self.wfile.write(body)
                    return
                data, info = got
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("ETag", f'"{info.etag}"')
                if info.last_modified == info.last_modified and info.last_modified > 0:  # not NaN, not unset
                    self.send_header("Last-Modified", formatdate(info.last_modified, usegmt=True))
                self.end_headers()
                if with_body:
                    self.wfile.write(data)

            def do_GET(self) -> None:
                self._serve(True)

            def do_HEAD(self) -> None:
                self._serve(False)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
                pass

        return Handler
