"""Which network addresses a validator may send requests to on a peer's behalf (docs/storage.md).

A peer chooses its own endpoint URL, so without a policy it could make every
validator send signed requests to the validator's own network: cloud metadata
(169.254.169.254), private ranges, loopback services.  The policy:

* the scheme is ``https``; plain ``http`` only to a loopback address when the run
  allows loopback endpoints (``storage.allow_loopback_endpoints``, local runs);
* every address the host name resolves to must be global (``ipaddress``'s
  ``is_global``: not private, loopback, link-local, shared/CGNAT, documentation,
  reserved or unspecified) and not multicast; IPv6 forms that embed an IPv4
  address (mapped, 6to4, Teredo) are judged by the embedded address;
* the check runs *after* DNS resolution, and the caller connects to the very
  address that was checked (no second lookup, so DNS rebinding gains nothing).

Functions here return a problem string (or None) and never raise on what a peer
wrote; :func:`resolve` raises :class:`EndpointRefused` for the client to turn
into a rejection.
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Any, cast

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class EndpointRefused(Exception):
    """The endpoint is outside the policy; the message says which address and why."""


@dataclass(frozen=True)
class EndpointPolicy:
    allow_loopback: bool = False  # http:// and loopback addresses (local networks and tests only)


STRICT = EndpointPolicy()
LOCAL = EndpointPolicy(allow_loopback=True)


def _embedded_v4(ip: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 address carries (mapped, 6to4, Teredo server), else ``ip`` itself."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
        if ip.teredo is not None:
            return ip.teredo[1]  # the client address; the server address is public by definition
    return ip


def _kind(ip: IPAddress) -> str:
    for attr, name in (("is_loopback", "loopback"), ("is_link_local", "link-local (cloud metadata lives here)"),
                       ("is_multicast", "multicast"), ("is_unspecified", "unspecified"),
                       ("is_private", "private"), ("is_reserved", "reserved")):
        if getattr(ip, attr):
            return name
    if isinstance(ip, ipaddress.IPv4Address) and ip in ipaddress.IPv4Network("100.64.0.0/10"):
        return "shared address space (CGNAT)"
    return "not globally routable"


def address_problem(address: str | IPAddress, scheme: str, policy: EndpointPolicy = STRICT) -> str | None:
    """Why the policy refuses to connect to ``address`` over ``scheme``, or None."""
    try:
        ip = _embedded_v4(ipaddress.ip_address(address))
    except ValueError:
        return f"{address!r} is not an IP address"
    if ip.is_loopback:
        return None if policy.allow_loopback else \
            f"{ip} is a loopback address (allowed only with storage.allow_loopback_endpoints, for local runs)"
    if not ip.is_global or ip.is_multicast:
        return f"{ip} is a {_kind(ip)} address"
    if scheme != "https":
        return f"plain {scheme} to {ip}: public endpoints must use https"
    return None


def resolve(host: str, port: int, scheme: str, policy: EndpointPolicy = STRICT) -> list[tuple[int, tuple[Any, ...]]]:
    """``getaddrinfo`` results (family, sockaddr) for ``host``, every one checked against the policy.

    Raises :class:`EndpointRefused` when the name does not resolve or *any* of its addresses is refused
    (a name that mixes public and private addresses is a rebinding attempt, not a mistake).  The lookup
    is the system resolver's: its time is bounded by the resolver's own timeout, not by our deadline."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as e:
        raise EndpointRefused(f"{host}: does not resolve ({e})") from None
    out: list[tuple[int, tuple[Any, ...]]] = []
    seen: set[str] = set()
    for family, _, _, _, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        address = cast(str, sockaddr[0])  # AF_INET / AF_INET6: the address as text
        problem = address_problem(address, scheme, policy)
        if problem:
            raise EndpointRefused(f"{host} resolves to {address}: {problem}")
        if address not in seen:
            seen.add(address)
            out.append((family, sockaddr))
    if not out:
        raise EndpointRefused(f"{host}: no IPv4 or IPv6 address")
    return out
