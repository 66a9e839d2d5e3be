"""A commitment may name any endpoint.  Peers' endpoints must be public https hosts
(loopback only with storage.allow_loopback_endpoints), checked after DNS resolution, connected to at the
checked address, with redirects not followed; a refused endpoint is a Rejection, never an exception."""
from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dso.config.schema import Config
from dso.protocol.rejections import Reason
from storage.commitment import BucketInfo
from storage.endpoints import LOCAL, STRICT, address_problem
from storage.gather import GatherOptions, ReaderCache, gather
from storage.peer_client import PeerClient
from storage.wire import Expect

WINDOW = 4
REAL_GETADDRINFO = socket.getaddrinfo


def _info(endpoint: str) -> BucketInfo:
    return BucketInfo(endpoint, "us-east-1", "dso-peer", "AKIAPEER", "s" * 40)


@pytest.mark.parametrize("address, words", [
    ("169.254.169.254", "link-local"), ("10.0.0.1", "private"), ("192.168.1.7", "private"),
    ("172.16.0.1", "private"), ("100.64.0.1", "CGNAT"), ("127.0.0.1", "loopback"), ("::1", "loopback"),
    ("0.0.0.0", "unspecified"), ("224.0.0.251", "multicast"), ("fe80::1", "link-local"),
    ("fd00::1", "private"), ("::ffff:10.0.0.1", "private"), ("2002:a00:1::", "private"),  # 6to4 of 10.0.0.1
    ("192.0.2.10", "private"),                                                       # documentation range
])
def test_non_global_addresses_are_refused(address, words):
    problem = address_problem(address, "https", STRICT)
    assert problem is not None and words in problem, problem


@pytest.mark.parametrize("address, form, words", [
    # IPv4-mapped (::ffff:a.b.c.d)
    ("::ffff:169.254.169.254", "IPv4-mapped", "link-local"), ("::ffff:127.0.0.1", "IPv4-mapped", "loopback"),
    ("::ffff:192.168.0.1", "IPv4-mapped", "private"),
    # IPv4-compatible (::a.b.c.d, deprecated)
    ("::a9fe:a9fe", "IPv4-compatible", "link-local"), ("::10.0.0.1", "IPv4-compatible", "private"),
    ("::7f00:1", "IPv4-compatible", "loopback"), ("::c0a8:101", "IPv4-compatible", "private"),
    # IPv4-translated (::ffff:0:a.b.c.d)
    ("::ffff:0:a9fe:a9fe", "IPv4-translated", "link-local"), ("::ffff:0:a00:1", "IPv4-translated", "private"),
    # NAT64 well-known prefix (64:ff9b::/96)
    ("64:ff9b::a9fe:a9fe", "NAT64 well-known prefix", "link-local"),
    ("64:ff9b::10.1.2.3", "NAT64 well-known prefix", "private"),
    ("64:ff9b::7f00:1", "NAT64 well-known prefix", "loopback"),
    ("64:ff9b::ac10:1", "NAT64 well-known prefix", "private"),            # 172.16.0.1
    # 6to4 (2002::/16: the IPv4 address in bits 16-47)
    ("2002:a9fe:a9fe::1", "6to4", "link-local"), ("2002:c0a8:101::", "6to4", "private"),
    ("2002:7f00:1::", "6to4", "loopback"),
])
def test_every_ipv6_form_of_a_private_ipv4_address_is_refused_with_its_form(address, form, words):
    """Each IPv6 form that carries an IPv4 address is judged by that address, and the reason names the form and
    the address (a validator would otherwise send signed requests to its own metadata service or network)."""
    problem = address_problem(address, "https", STRICT)
    assert problem is not None and words in problem and form in problem, problem


@pytest.mark.parametrize("address", ["64:ff9b:1::a9fe:a9fe", "64:ff9b:1:a9:fe00:a9fe::", "64:ff9b:1:0:a:a00:100::",
                                     "64:ff9b:1::808:808"])
def test_nat64_local_use_prefix_is_refused_whole(address):
    """RFC 8215's local-use prefix puts the IPv4 address where the operator chose (any RFC 6052 length): every
    address in 64:ff9b:1::/48 is refused, whichever IPv4 address it might carry."""
    problem = address_problem(address, "https", STRICT)
    assert problem is not None and "local-use" in problem and "64:ff9b:1::/48" in problem, problem
    assert address_problem(address, "http", LOCAL) is not None  # not loopback: refused in local runs too


def test_ipv6_forms_of_a_public_ipv4_address():
    """The NAT64 well-known prefix and 6to4 reach public IPv4 hosts and pass over https; the deprecated
    IPv4-compatible form is refused with a reason even for a public address; :: and ::1 stay IPv6's own."""
    assert address_problem("64:ff9b::808:808", "https", STRICT) is None
    assert address_problem("2002:808:808::1", "https", STRICT) is None
    assert "deprecated" in address_problem("::808:808", "https", STRICT)
    assert "unspecified" in address_problem("::", "https", STRICT)
    assert "loopback" in address_problem("::1", "https", STRICT)
    assert address_problem("::ffff:0:808:808", "https", STRICT) is None   # IPv4-translated 8.8.8.8


def test_public_https_passes_plain_http_only_to_loopback_when_allowed():
    assert address_problem("8.8.8.8", "https", STRICT) is None
    assert address_problem("2606:4700::1111", "https", STRICT) is None
    assert "https" in address_problem("8.8.8.8", "http", STRICT)
    assert "https" in address_problem("8.8.8.8", "http", LOCAL)           # allowance is for loopback only
    assert address_problem("127.0.0.1", "http", LOCAL) is None
    assert address_problem("10.0.0.1", "https", LOCAL) is not None       # private stays refused locally


def test_config_key_defaults_to_strict():
    assert Config().storage.allow_loopback_endpoints is False
    assert ReaderCache.from_config(Config().storage).policy == STRICT


@pytest.mark.parametrize("endpoint", [
    "https://169.254.169.254", "https://10.0.0.1", "https://100.64.0.1:9000", "http://127.0.0.1:9090",
    "https://[::1]", "https://[::ffff:10.0.0.1]", "http://8.8.8.8", "http://s3.example.com",
])
def test_refused_commitments_are_rejections_before_any_connection(endpoint, codec, hp, monkeypatch):
    def no_network(*args, **kw):
        raise AssertionError("a refused endpoint must not be resolved or connected to")

    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    result = gather(WINDOW, {3: _info(endpoint)}, codec, Expect.from_hparams(hp, WINDOW), None, 5,
                    GatherOptions(readers=ReaderCache()))
    assert not result.payloads and result.rejections[3].reason is Reason.BAD_COMMITMENT
    assert endpoint[:20] in result.rejections[3].detail


class _Counting(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _answer(self, with_body: bool) -> None:
        self.server.requests += 1
        if self.server.redirect_to:
            self.send_response(307)
            self.send_header("Location", self.server.redirect_to + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Last-Modified", "Mon, 01 Jan 2024 00:00:00 GMT")
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def do_HEAD(self):
        self._answer(False)

    def do_GET(self):
        self._answer(True)


@pytest.fixture
def server():
    servers = []

    def start(redirect_to: str = ""):
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
        srv.daemon_threads, srv.requests, srv.redirect_to = True, 0, redirect_to
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def _resolving(monkeypatch, answers: dict[str, list[str]], calls: list):
    """Make host names resolve to the given addresses (each call pops the next answer when several)."""
    def fake(host, port, *args, **kw):
        if host not in answers:
            return REAL_GETADDRINFO(host, port, *args, **kw)
        calls.append(host)
        queue = answers[host]
        address = queue.pop(0) if len(queue) > 1 else queue[0]
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (address, port))]
    monkeypatch.setattr(socket, "getaddrinfo", fake)


def test_a_name_resolving_to_a_private_address_is_refused_and_never_contacted(server, codec, hp, monkeypatch):
    """The check runs after DNS: `metadata.example` looks public but resolves to loopback, and a strict
    reader must not send it a single request (the old reader sent signed HEADs there)."""
    srv = server()
    _resolving(monkeypatch, {"metadata.example": ["127.0.0.1"]}, [])
    info = _info(f"https://metadata.example:{srv.server_address[1]}")
    result = gather(WINDOW, {7: info}, codec, Expect.from_hparams(hp, WINDOW), None, 5,
                    GatherOptions(readers=ReaderCache()))
    assert result.rejections[7].reason is Reason.BAD_COMMITMENT
    assert "resolves to 127.0.0.1" in result.rejections[7].detail
    assert srv.requests == 0


def test_the_address_connected_to_is_the_one_checked(server, monkeypatch):
    """DNS rebinding: the name answers loopback (allowed in a local run) and then the metadata address.
    One request resolves once and connects to what it checked; the next request re-checks and refuses."""
    srv = server()
    calls: list = []
    _resolving(monkeypatch, {"rebind.example": ["127.0.0.1", "169.254.169.254"]}, calls)
    client = PeerClient(_info(f"http://rebind.example:{srv.server_address[1]}"), LOCAL, timeout=5)
    assert client.get("dso-peer", "k") == b"{}"
    assert calls == ["rebind.example"] and srv.requests == 1
    with pytest.raises(Exception) as caught:
        client.get("dso-peer", "k")
    assert getattr(caught.value, "kind", None) == "refused" and "169.254.169.254" in str(caught.value)
    assert srv.requests == 1


def test_redirects_are_not_followed(server, codec, hp):
    target = server()
    bouncer = server(redirect_to=f"http://127.0.0.1:{target.server_address[1]}")
    info = _info(f"http://127.0.0.1:{bouncer.server_address[1]}")
    result = gather(WINDOW, {2: info}, codec, Expect.from_hparams(hp, WINDOW), None, 5,
                    GatherOptions(readers=ReaderCache(allow_loopback=True)))
    assert result.rejections[2].reason is Reason.UNREACHABLE and "redirect" in result.rejections[2].detail
    assert bouncer.requests == 1 and target.requests == 0
