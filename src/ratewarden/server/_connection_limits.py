"""What one client may hold of the service: connections, time and bytes.

Both listeners (the HTTP API on our HTTP/1.1 server and the HTTP/2 gRPC server) take the
same `ConnectionLimits` and `ServerLimits`, so an operator sets one policy for
the process and a client that is slow, idle or large on purpose is closed the
same way on either. They share one `BodyBudget` (the bytes of unfinished
requests the process holds) and each keeps an `Admission` (which connections
it keeps, per peer and in all).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from ..primitives import ConfigurationError

__all__ = [
    "Admission",
    "BodyBudget",
    "ConnectionLimits",
    "ServerLimits",
    "peer_of",
    "process_budget",
]


@dataclass(frozen=True)
class ConnectionLimits:
    """Per-listener bounds.

    - ``max_connections``: open connections a listener keeps; one more is closed
      at once (a fixed cost, never a file descriptor more), so a flood of idle
      connections cannot starve the other listener or the store's sockets.
    - ``idle_timeout``: seconds a connection may sit with no request in flight
      and nothing received before it is closed.
    - ``header_timeout``: seconds from a request's first byte to its last header
      (HTTP) or from a header block's first frame to its last (HTTP/2): a slow
      sender of headers is closed.
    - ``body_timeout``: seconds a request body may take to arrive once its
      headers are in: a body shorter than its Content-Length, or one sent a byte
      a second, ends with 408 (HTTP) or the stream reset (HTTP/2).
    - ``max_header_bytes``: the size of a request's headers (HTTP: the raw
      head; HTTP/2: the decoded list, each field counted as name + value + 32 as
      RFC 9113 defines it, and advertised as SETTINGS_MAX_HEADER_LIST_SIZE).
    - ``partial_grace`` (HTTP): seconds a request's head and body may take to
      arrive before, at ``max_connections``, its connection may be closed to
      admit a new one from another address (at the per-address cap, the
      address's own go first, whatever their age; see `Admission`). A client
      on a sound network sends both in a round trip or two; past this it is
      slow, or holds the slot on purpose (slowloris).
    """

    max_connections: int = 10_000
    idle_timeout: float = 60.0
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_header_bytes: int = 16 * 1024
    partial_grace: float = 1.0

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if field.type == "int" or isinstance(value, bool):
                if type(value) is not int or value < 1:
                    raise ConfigurationError(f"{field.name} must be an integer >= 1, got {value!r}")
            elif not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigurationError(
                    f"{field.name} must be a number of seconds > 0, got {value!r}"
                )
        if self.max_header_bytes < 1024:
            raise ConfigurationError(
                f"max_header_bytes must be >= 1024, got {self.max_header_bytes!r}"
            )


@dataclass(frozen=True)
class ServerLimits:
    """What the process as a whole holds for its clients, whoever they are.

    - ``max_buffered_bytes``: request bytes held for requests that have not
      ended yet (HTTP bodies still arriving, HTTP/2 streams without END_STREAM),
      across every connection of both listeners. Past it the body held longest
      is dropped (HTTP 503, a gRPC RESOURCE_EXHAUSTED answer) to make room: a
      request that arrives whole is never the one dropped, so checks keep
      their answers while unfinished bodies cannot grow memory past the bound.
    - ``max_stream_bytes``: an HTTP/2 request's body, and the window a stream
      is given (SETTINGS_INITIAL_WINDOW_SIZE); a gRPC message that says it is
      larger is answered RESOURCE_EXHAUSTED at once.
    - ``max_connections_per_peer``: connections one source address keeps on a
      listener; past it, and at ``max_connections``, the connection idle the
      longest (the peer's own, at the peer's limit) is closed to admit the new
      one, or else (HTTP) the one whose request has been arriving longest, past
      ``partial_grace``: so that one address cannot hold every slot, idle or
      dripping its requests.
    """

    max_buffered_bytes: int = 32 * 1024 * 1024
    max_stream_bytes: int = 256 * 1024
    max_connections_per_peer: int = 1_000

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if type(value) is not int or value < 1:
                raise ConfigurationError(f"{field.name} must be an integer >= 1, got {value!r}")
        if self.max_stream_bytes < 16_384:
            raise ConfigurationError(
                f"max_stream_bytes must be >= 16384 (a frame), got {self.max_stream_bytes!r}"
            )
        if self.max_buffered_bytes < self.max_stream_bytes:
            raise ConfigurationError(
                f"max_buffered_bytes ({self.max_buffered_bytes}) must be at least "
                f"max_stream_bytes ({self.max_stream_bytes})"
            )


class BodyBudget:
    """The bytes of unfinished requests the process holds, and who holds them.

    A holder (an HTTP/2 stream, an HTTP connection reading a body) `take`s
    bytes as they arrive and gives them back with `drop` once its request has
    ended or gone. Holders are kept in the order they first took bytes: when a
    `take` goes past ``max_bytes``, the oldest holders other than the taker are
    shed (their ``shed`` callback, called with the holder, ends their request) until it fits. Every
    operation is a dict lookup or two."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self.shed = 0  # requests dropped to make room
        self._holders: dict[object, list[Any]] = {}  # holder: [bytes, shed callback]

    def __repr__(self) -> str:
        return (f"<BodyBudget {self.used} of {self.max_bytes} bytes, "
                f"{len(self._holders)} holders, {self.shed} shed>")  # fmt: skip

    def take(self, holder: object, size: int, shed: Callable[[Any], None]) -> bool:
        """``size`` more bytes held by ``holder``; False if it was shed itself
        (it alone holds more than the budget)."""
        entry = self._holders.get(holder)
        if entry is None:
            self._holders[holder] = [size, shed]
        else:
            entry[0] += size
        self.used += size
        if self.used <= self.max_bytes:
            return True
        for victim in list(self._holders):
            if self.used <= self.max_bytes:
                break
            if victim is not holder:
                self._shed(victim)
        if self.used > self.max_bytes:
            self._shed(holder)
            return False
        return True

    def give_back(self, holder: object, size: int) -> None:
        """``size`` of the holder's bytes were read."""
        entry = self._holders.get(holder)
        if entry is not None:
            size = min(size, entry[0])
            entry[0] -= size
            self.used -= size

    def drop(self, holder: object) -> None:
        """The holder holds nothing any more (its request ended or went)."""
        entry = self._holders.pop(holder, None)
        if entry is not None:
            self.used -= entry[0]

    def _shed(self, holder: object) -> None:
        size, shed = self._holders.pop(holder)
        self.used -= size
        self.shed += 1
        shed(holder)


_budgets: dict[int, BodyBudget] = {}


def process_budget(max_bytes: int) -> BodyBudget:
    """The one budget of ``max_bytes`` the listeners of this process share."""
    budget = _budgets.get(max_bytes)
    if budget is None:
        budget = _budgets[max_bytes] = BodyBudget(max_bytes)
    return budget


def _first(connections: dict[Any, Any] | None) -> Any:
    return None if not connections else next(iter(connections))


class Admission:
    """Which connections a listener keeps: at most ``max_connections``, and
    ``per_peer`` from one source address. A connection past either limit takes
    the place of one already open, which `admit` closes with its ``evict``: the
    one idle longest, else the one whose request has been arriving longest (see
    `reading`). At the address's own limit that is the address's own, whatever
    its age; at ``max_connections`` any address's, once past ``grace`` seconds
    (`ConnectionLimits.partial_grace`), so that another address's request on its
    way is not cut short. A connection whose request is being answered is never
    closed for another: with none of either kind, the new one is refused.

    Each kind is kept oldest first, in all and per address, so that finding the
    connection to close is a dict lookup whatever the number open."""

    def __init__(self, max_connections: int, per_peer: int, grace: float = 1.0) -> None:
        self.max_connections = max_connections
        self.per_peer = per_peer
        self.grace = grace
        self.count = 0
        self.evicted = 0
        self._peer_of: dict[Any, str] = {}
        self._peers: dict[str, int] = {}
        self._idle: dict[Any, None] = {}  # oldest first
        self._idle_of: dict[str, dict[Any, None]] = {}
        self._partial: dict[Any, float] = {}  # connection: when its request began, oldest first
        self._partial_of: dict[str, dict[Any, float]] = {}

    def __repr__(self) -> str:
        return (f"<Admission {self.count} of {self.max_connections}, {len(self._peers)} peers, "
                f"{len(self._idle)} idle, {len(self._partial)} reading, "
                f"{self.evicted} evicted>")  # fmt: skip

    def admit(self, connection: Any, peer: str, now: float = 0.0) -> bool:
        """Whether ``connection`` (idle from now on) may stay, at ``now`` on the
        clock `reading` is told of; its ``evict()`` is called if it is later
        closed to make room."""
        if self._peers.get(peer, 0) >= self.per_peer:
            # the address's own: its idle one, else its request arriving longest,
            # whatever its age, so that reopening slow connections faster than the
            # grace passes cannot keep the address's other clients out
            victim = _first(self._idle_of.get(peer))
            if victim is None:
                victim = _first(self._partial_of.get(peer))
                if victim is None:
                    return False
            self._evict(victim)
        if self.count >= self.max_connections:
            victim = _first(self._idle)
            if victim is None:
                victim = self._stalled(self._partial, now)
                if victim is None:
                    return False
            self._evict(victim)
        self.count += 1
        self._peer_of[connection] = peer
        self._peers[peer] = self._peers.get(peer, 0) + 1
        self._set_idle(connection, peer)
        return True

    def idle(self, connection: Any) -> None:
        """Nothing in flight: closed first to make room."""
        peer = self._peer_of.get(connection)
        if peer is not None:
            self._unset(connection, peer)
            self._set_idle(connection, peer)

    def reading(self, connection: Any, since: float) -> None:
        """A request has been arriving since ``since`` (its first byte), and
        nothing is being answered: closed to make room once past the grace."""
        peer = self._peer_of.get(connection)
        if peer is not None:
            self._unset(connection, peer)
            self._partial[connection] = since
            self._partial_of.setdefault(peer, {})[connection] = since

    def busy(self, connection: Any) -> None:
        """A request is being answered: never closed to make room."""
        peer = self._peer_of.get(connection)
        if peer is not None:
            self._unset(connection, peer)

    def left(self, connection: Any) -> None:
        """The connection closed (or was evicted); idempotent."""
        peer = self._peer_of.pop(connection, None)
        if peer is None:
            return
        self._unset(connection, peer)
        self.count -= 1
        left = self._peers[peer] - 1
        if left:
            self._peers[peer] = left
        else:
            del self._peers[peer]

    def _stalled(self, partial: dict[Any, float] | None, now: float) -> Any:
        """The connection whose request has been arriving longest, if longer
        than the grace (the oldest first: if it is not, none is)."""
        if not partial:
            return None
        victim = next(iter(partial))
        return victim if now - partial[victim] >= self.grace else None

    def _set_idle(self, connection: Any, peer: str) -> None:
        self._idle[connection] = None
        self._idle_of.setdefault(peer, {})[connection] = None

    def _unset(self, connection: Any, peer: str) -> None:
        """Neither idle nor reading."""
        if connection in self._idle:
            del self._idle[connection]
            mine = self._idle_of[peer]
            del mine[connection]
            if not mine:
                del self._idle_of[peer]
        if connection in self._partial:
            del self._partial[connection]
            mine_partial = self._partial_of[peer]
            del mine_partial[connection]
            if not mine_partial:
                del self._partial_of[peer]

    def _evict(self, connection: Any) -> None:
        self.left(connection)
        self.evicted += 1
        connection.evict()


def peer_of(transport: Any) -> str:
    """The source address of a connection ('' for a Unix socket)."""
    address = transport.get_extra_info("peername")
    if isinstance(address, tuple) and address:
        return str(address[0])
    return ""
