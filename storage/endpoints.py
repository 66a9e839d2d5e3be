"""Which network addresses a validator may send requests to on a peer's behalf (docs/storage.md).

A peer chooses its own endpoint URL, so without a policy it could make every
validator send signed requests to the validator's own network: cloud metadata
(169.254.169.254), private ranges, loopback services.  The policy:

* the scheme is ``https``; plain ``http`` only to a loopback address when the run
  allows loopback endpoints (``storage.allow_loopback_endpoints``, local runs);
* every address the host name resolves to must be global (``ipaddress``'s
  ``is_global``: not private, loopback, link-local, shared/CGNAT, documentation,
  reserved or unspecified) and not multicast; IPv6 forms that embed an IPv4
  address (IPv4-mapped, IPv4-compatible, IPv4-translated, NAT64's well-known
  prefix, 6to4, Teredo) are judged by the embedded address, and NAT64's local-use
  prefix, whose IPv4 address sits where the operator chose, is refused whole;
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


# IPv6 prefixes whose last 32 bits are an IPv4 address a router or the host stack reaches (RFC 4291 §2.5.5,
# RFC 2765 §2.1, RFC 6052 §2.1): judged by that address.  ``ipaddress`` knows the mapped form only.
_LAST_32_BITS = (
    (ipaddress.IPv6Network("::/96"), "IPv4-compatible"),                  # deprecated, still routed by some stacks
    (ipaddress.IPv6Network("::ffff:0:0:0/96"), "IPv4-translated"),        # SIIT
    (ipaddress.IPv6Network("64:ff9b::/96"), "NAT64 well-known prefix"),   # RFC 6052: only global IPv4 behind it
)
# RFC 8215: a NAT64 prefix for one operator's own network, of any length up to /96, so the embedded IPv4
# address can sit at any of RFC 6052's offsets.  Nothing public is reached through it: refused whole.
NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")


def _embedded_v4(ip: IPAddress) -> tuple[IPAddress, str]:
    """The IPv4 address an IPv6 address carries and the form that carries it, else ``(ip, "")``."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return ip, ""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped, "IPv4-mapped"
    if ip.sixtofour is not None:
        return ip.sixtofour, "6to4"
    if ip.teredo is not None:
        return ip.teredo[1], "Teredo"  # the client address; the server address is public by definition
    for network, form in _LAST_32_BITS:
        if ip in network and int(ip) & 0xFFFFFFFF > 1:  # not :: and ::1, which are IPv6's own
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF), form
    return ip, ""


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
        outer = ipaddress.ip_address(address)
    except ValueError:
        return f"{address!r} is not an IP address"
    if outer in NAT64_LOCAL_USE:
        return f"{outer} is in NAT64's local-use prefix {NAT64_LOCAL_USE}: it reaches IPv4 addresses of the " \
               "operator's own network"
    ip, form = _embedded_v4(outer)
    named = f"{outer} ({form} form of {ip})" if form else str(ip)
    if ip.is_loopback:
        return None if policy.allow_loopback else \
            f"{named} is a loopback address (allowed only with storage.allow_loopback_endpoints, for local runs)"
    if not ip.is_global or ip.is_multicast:
        return f"{named} is a {_kind(ip)} address"
    if form == "IPv4-compatible":  # deprecated (RFC 4291 §2.5.5.1): no public endpoint is written this way
        return f"{named}: the IPv4-compatible form is deprecated; publish the IPv4 address itself"
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
