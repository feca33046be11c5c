"""Which address a request comes from: the peer's, or, behind trusted proxies,
the right-most hop of the forwarding header that is not one of them.

Rules key counters on ``ip``; a key that a client can choose (the left-most
``X-Forwarded-For`` entry) would let it spread its requests over any number of
counters, so only hops added by proxies the operator names are believed.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable, Mapping

from ._schema import ClientIP

__all__ = ["client_ip_function", "peer_ip"]


def peer_ip(attributes: Mapping[str, object]) -> object:
    return attributes.get("ip")


def client_ip_function(config: ClientIP) -> Callable[[Mapping[str, object]], object]:
    """``ip``, unless the peer is a trusted proxy: then the right-most address in
    the forwarding header that is not a trusted proxy (the left-most entries are
    whatever the client chose to send and prove nothing)."""
    proxies = config.trusted_proxies
    networks = tuple(ipaddress.ip_network(n, strict=False) for n in proxies if n != "unix")
    # "unix": a peer without an address (a proxy on a unix socket) is trusted
    unix = "unix" in proxies
    if not networks and not unix:
        return peer_ip
    header = config.header.lower()

    @functools.lru_cache(maxsize=4096)
    def trusted(address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in networks)

    def client_ip(attributes: Mapping[str, object]) -> object:
        peer = attributes.get("ip")
        if peer is None:
            if not unix:
                return None
        elif not isinstance(peer, str) or not trusted(peer):
            return peer
        headers = attributes.get("headers")
        forwarded = headers.get(header) if isinstance(headers, Mapping) else None
        if not isinstance(forwarded, str) or not forwarded.strip():
            return peer
        hops = [hop.strip() for hop in forwarded.split(",")]
        if header == "forwarded":
            hops = [_forwarded_for(hop) for hop in hops]
        else:  # some proxies add the port: "203.0.113.9:1111", "[2001:db8::1]:4711"
            hops = [_without_port(hop) for hop in hops]
        for hop in reversed(hops):
            if hop and not trusted(hop):
                return hop
        return hops[0] or peer  # every hop is ours: the first is as close as we get

    return client_ip


def _without_port(address: str) -> str:
    """An address without a port or IPv6 brackets, so one client is one key."""
    if address.startswith("["):
        return address[1:].partition("]")[0]
    return address.partition(":")[0] if address.count(":") == 1 else address


def _forwarded_for(element: str) -> str:
    """The address in one element of an RFC 7239 ``Forwarded`` header (``for=``,
    unquoted, without port or IPv6 brackets); "" when it names none."""
    for pair in element.split(";"):
        name, _, value = pair.strip().partition("=")
        if name.strip().lower() != "for":
            continue
        return _without_port(value.strip().strip('"'))  # "[2001:db8::1]:4711"
    return ""
