"""The listeners' addresses: ``HOST:PORT`` options read and checked, and a
socket bound to one before the workers start (they share it).
"""

from __future__ import annotations

import socket

from ..primitives import ConfigurationError

__all__ = ["LOOPBACK", "bind", "listen_address", "parse_address"]

LOOPBACK = "127.0.0.1"  # where the listeners are by default, and a bare port


def listen_address(text: str, what: str) -> str | None:
    """An address option as given, a bare port on the loopback host of the
    defaults (``18481`` is ``127.0.0.1:18481``), or None for ``off``."""
    if text == "off":
        return None
    address = f"{LOOPBACK}:{text}" if text.isascii() and text.isdigit() else text
    try:
        parse_address(address, what)
    except ConfigurationError:
        parse_address(text, what)  # the error names what was given
        raise
    return address


def parse_address(text: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8081`` for IPv6); an empty host listens everywhere."""
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ConfigurationError(
            f"{what} takes HOST:PORT, a PORT ({LOOPBACK}:PORT) or 'off', got {text!r}"
        )
    return host.strip("[]") or "0.0.0.0", int(port)


def bind(address: str) -> socket.socket:
    host, port = parse_address(address, "--http")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigurationError(f"cannot listen on {address}: {exc.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
