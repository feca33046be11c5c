"""One Redis connection driven directly, for `AsyncRedisStore`'s batches on a
single node.

redis-py's asyncio pipeline costs about 50 us of CPU per round trip (pool
checkout, command packing, a task for the timed write, a timeout scope per
reply, parsing through its stream layers); at moderate load a batch holds one or
two checks, so that cost is most of what a check costs beyond the HTTP server.
Here redis-py still makes the connection (TCP, TLS or a Unix socket, with the
AUTH, SELECT and timeouts of the URL), then an `asyncio.Protocol` takes over its
transport: commands go out packed by hiredis, replies come back parsed by a
hiredis reader in ``data_received``, each round trip one future, under ~10 us.

Failures look as they did through the pipeline, so the store maps them as it
did: a lost or refused connection raises `redis.exceptions.ConnectionError`, a
round trip not over by its deadline (the caller's, else the URL's socket timeout
from now; connecting counts) raises `redis.exceptions.TimeoutError` (and drops
the connection: a late reply would answer the wrong request), and
error replies come back in their place as redis-py's exceptions (`NoScriptError`
...). The next round trip after a drop connects again.

Only for a plain ``redis.asyncio.Redis`` on one server speaking RESP2 (see
`usable`): a cluster routes by key, a Sentinel-managed client follows failovers,
RESP3 can push unasked-for replies; those keep redis-py's pipeline.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
import redis.utils
from redis._parsers import BaseParser
from redis.asyncio.connection import (
    Connection,
    ConnectionPool,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse
from redis.exceptions import TimeoutError as RedisTimeoutError

try:  # the redis extra brings it; a bare redis-py keeps the pipelines
    import hiredis

    HIREDIS = True
except ImportError:
    HIREDIS = False

__all__ = ["AsyncWire", "Unsupported", "plain_replies", "usable"]

Arg = bytes | str | int
_PLAIN = (Connection, SSLConnection, UnixDomainSocketConnection)


def usable(client: Any) -> bool:
    """Whether `AsyncWire` can carry ``client``'s commands: a ``redis.asyncio.Redis``
    with a plain pool of plain connections, RESP2, UTF-8 (hiredis packs str as
    UTF-8)."""
    if not HIREDIS or type(client) is not aioredis.Redis:
        return False
    pool = client.connection_pool
    if type(pool) is not ConnectionPool or pool.connection_class not in _PLAIN:
        return False
    return plain_replies(pool.connection_kwargs)


def plain_replies(kwargs: dict[str, Any]) -> bool:
    """Whether connections made with ``kwargs`` speak RESP2 and encode str as strict
    UTF-8, as a hiredis reader and packer of the stores' own assume (sync and async)."""
    protocol = kwargs.get("protocol")
    if protocol is None:  # redis-py's default: RESP2 up to 7, RESP3 from 8
        protocol = getattr(redis.utils, "DEFAULT_RESP_VERSION", 2)
    return (
        str(protocol) == "2"
        and kwargs.get("encoding", "utf-8").lower().replace("_", "-") in ("utf-8", "utf8")
        and kwargs.get("encoding_errors", "strict") == "strict"
    )


class Unsupported(Exception):
    """This redis-py's connections cannot be taken over (their insides changed):
    the caller goes back to redis-py's pipeline."""


class _Request:
    __slots__ = ("count", "future", "replies", "timer")

    def __init__(self, future: asyncio.Future[list[Any]], count: int) -> None:
        self.future, self.count = future, count
        self.replies: list[Any] = []
        self.timer: asyncio.TimerHandle | None = None


class _Link(asyncio.Protocol):
    """A connection's transport once redis-py has set it up: requests answered in
    the order they were sent. Dead for good after the first failure."""

    def __init__(self, transport: asyncio.Transport, where: str) -> None:
        self.transport, self.where = transport, where
        self.reader = hiredis.Reader(
            protocolError=InvalidResponse, replyError=BaseParser.parse_error
        )
        self.waiting: collections.deque[_Request] = collections.deque()
        self.dead: Exception | None = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def send(self, payload: bytes, count: int, deadline: float | None) -> asyncio.Future[list[Any]]:
        loop = asyncio.get_running_loop()
        request = _Request(loop.create_future(), count)
        if self.dead is not None:
            request.future.set_exception(self.dead)
            return request.future
        if deadline is not None:
            request.timer = loop.call_at(deadline, self._expired, request)
        self.waiting.append(request)
        try:
            self.transport.write(payload)
        except (OSError, RuntimeError) as exc:  # uvloop: RuntimeError once it is closed
            self.fail(RedisConnectionError(f"Error while writing to {self.where}: {exc}"))
        return request.future

    def _expired(self, request: _Request) -> None:
        if not request.future.done():
            self.fail(RedisTimeoutError(f"Timeout reading from {self.where}"))

    def data_received(self, data: bytes) -> None:
        reader, waiting = self.reader, self.waiting
        try:
            reader.feed(data)
            while (reply := reader.gets()) is not False:
                if not waiting:
                    raise InvalidResponse("a reply nothing asked for")
                request = waiting[0]
                request.replies.append(reply)
                if len(request.replies) == request.count:
                    waiting.popleft()
                    if request.timer is not None:
                        request.timer.cancel()
                    if not request.future.done():  # else its caller was cancelled
                        request.future.set_result(request.replies)
        except InvalidResponse as exc:
            self.fail(RedisConnectionError(f"Protocol error from {self.where}: {exc}"))

    def eof_received(self) -> bool:
        self.fail(RedisConnectionError(f"Connection closed by server ({self.where})."))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        reason = "Connection closed by server." if exc is None else f"{exc}"
        self.fail(RedisConnectionError(f"Error while reading from {self.where} : {reason}"))
        if not self.lost.done():
            self.lost.set_result(None)

    def fail(self, error: Exception) -> None:
        """Fail every request in flight and drop the connection."""
        if self.dead is None:
            self.dead = error
            self.transport.abort()
        while self.waiting:
            request = self.waiting.popleft()
            if request.timer is not None:
                request.timer.cancel()
            if not request.future.done():
                request.future.set_exception(error)


class AsyncWire:
    """A connection of its own to ``client``'s server (see `usable`), made on the
    first call and again after a failure. Calls may overlap (the store's batcher
    keeps a few round trips out): each is written whole, and the replies come back
    in order; one connects while the others wait for it."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.pool: ConnectionPool = client.connection_pool
        timeout = self.pool.connection_kwargs.get("socket_timeout")
        self.timeout: float | None = None if timeout is None else float(timeout)
        kwargs = self.pool.connection_kwargs
        self.where = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
        self.connection: Any = None  # redis-py's, kept to close it
        self.link: _Link | None = None
        self.connecting = asyncio.Lock()

    async def call(
        self, commands: Sequence[Sequence[Arg]], deadline: float | None = None
    ) -> list[Any]:
        """One round trip: the replies of ``commands`` in order, an error reply as
        redis-py's exception in its place. Over by ``deadline`` (the loop's clock;
        by default the socket timeout from now), connecting included, or it raises
        redis-py's TimeoutError."""
        pack = hiredis.pack_command  # its stub says a 1-tuple; it takes any length
        payload = b"".join([pack(tuple(command)) for command in commands])  # type: ignore[arg-type]
        if deadline is None and self.timeout is not None:
            deadline = asyncio.get_running_loop().time() + self.timeout
        link = self.link
        if link is None or link.dead is not None or link.transport.is_closing():
            async with self.connecting:  # one connects; the others take its link
                link = self.link
                if link is None or link.dead is not None or link.transport.is_closing():
                    link = await self._connect(deadline)
        return await link.send(payload, len(commands), deadline)

    async def _connect(self, deadline: float | None) -> _Link:
        await self.aclose()
        connection = self.connection = self.pool.make_connection()  # type: ignore[no-untyped-call]
        try:
            # redis-py's: socket, TLS, AUTH, SELECT, each step under its own timeout;
            # the deadline bounds them together
            async with asyncio.timeout_at(deadline):
                await connection.connect()
        except TimeoutError as exc:
            await self.aclose()
            raise RedisTimeoutError(f"Timeout connecting to {self.where}") from exc
        transport: Any = getattr(getattr(connection, "_writer", None), "transport", None)
        # duck-typed: uvloop's transports are no asyncio.Transport subclasses
        if not all(hasattr(transport, name) for name in ("set_protocol", "write", "abort")):
            await self.aclose()
            raise Unsupported(f"cannot take over redis-py's connection {connection!r}")
        link = _Link(transport, self.where)
        transport.set_protocol(link)
        self.link = link
        return link

    async def aclose(self) -> None:
        connection, link = self.connection, self.link
        self.connection = self.link = None
        if link is not None:
            # Aborted, and waited for: a TLS transport closed gracefully waits for
            # the server's close_notify (which a dead server never sends), and the
            # loop could close before it did, leaving the transport unclosed.
            link.transport.abort()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await asyncio.shield(link.lost)
        if connection is not None:
            await connection.disconnect(nowait=True)

    def __repr__(self) -> str:
        state = "idle" if self.link is None else "broken" if self.link.dead else "connected"
        return f"<AsyncWire {state} {self.pool!r}>"
