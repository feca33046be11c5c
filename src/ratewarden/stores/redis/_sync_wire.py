"""Connections of `RedisStore`'s own to one server, driven directly.

redis-py's sync client spends about 30 us of CPU on a command beyond the system
calls of the round trip itself (a pool checkout under a lock, pid and health
checks, observability hooks, packing in Python, parsing through its buffers); a
check is one command, so that was most of what a check cost the client. Here
redis-py still makes each connection (TCP, TLS or a Unix socket, with the URL's
AUTH, SELECT and timeouts), then the store writes to its socket directly, the
command packed by hiredis, and reads the reply with a hiredis reader.

What redis-py's pool does for a caller, this does too:

- Threads: a call takes an idle connection (or makes one) and gives it back
  after; two threads never share one. A forked child drops the parent's idle
  connections (their sockets are the parent's too) and makes its own.
- An idle connection that has something to read before a command goes out (the
  server closed it: restarted, or ``CLIENT KILL``) is replaced first, so that a
  server restarted between two checks costs no failed check.
- Failures are redis-py's exceptions, so the store maps them as before: a lost or
  refused connection raises `redis.exceptions.ConnectionError`; a round trip not
  over within the socket timeout (the whole round trip, not each read) raises
  `redis.exceptions.TimeoutError`; either drops the connection (a late reply would
  answer the next command) and the next call connects again. An error reply is
  raised as redis-py's exception for it (`NoScriptError` ...), and the connection
  stays in use.

Only for a plain ``redis.Redis`` on one server speaking RESP2 (see `usable`): a
cluster routes by key, a Sentinel-managed client follows failovers, RESP3 can push
unasked-for replies; those keep redis-py.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import sys
import time
import weakref
from ssl import SSLSocket
from typing import Any

import redis
from redis._parsers import BaseParser
from redis.connection import (
    Connection,
    ConnectionPool,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._async_wire import Unsupported, plain_replies

try:  # the redis extra brings it; a bare redis-py keeps redis-py's commands
    import hiredis

    HIREDIS = True
except ImportError:
    HIREDIS = False

__all__ = ["Wire", "usable"]

_PLAIN = (Connection, SSLConnection, UnixDomainSocketConnection)
_CHUNK = 65536
_POLLIN = select.POLLIN
# Where the kernel takes a send and a receive timeout as a struct timeval
_KERNEL_TIMEOUTS = sys.platform in ("linux", "darwin")
_TIMEVAL = struct.Struct("@ll")


def _timeval(seconds: float) -> bytes:
    # a zero timeval means no timeout at all: at least a microsecond
    whole = int(seconds)
    return _TIMEVAL.pack(whole, max(int((seconds - whole) * 1e6), 0 if whole else 1))


def usable(client: Any) -> bool:
    """Whether `Wire` can carry ``client``'s commands: a ``redis.Redis`` with
    a plain pool of plain connections, RESP2, UTF-8 (hiredis packs str as UTF-8)."""
    if not HIREDIS or type(client) is not redis.Redis:
        return False
    pool = client.connection_pool
    if type(pool) is not ConnectionPool or pool.connection_class not in _PLAIN:
        return False
    return plain_replies(pool.connection_kwargs) and not getattr(
        client, "single_connection_client", False
    )


class _Link:
    """One connection redis-py made, its socket read and written here."""

    __slots__ = ("connection", "kernel", "poller", "reader", "sock")

    def __init__(self, connection: Any, sock: socket.socket, timeout: float | None) -> None:
        self.connection, self.sock = connection, sock
        # A plain socket is bounded by the kernel (SO_SNDTIMEO, SO_RCVTIMEO) and left
        # blocking: Python's own timeout polls before every send and every receive,
        # two system calls more per round trip than the send and the receive. TLS
        # keeps Python's, which the ssl module's reads and writes expect.
        self.kernel = False
        if _KERNEL_TIMEOUTS and timeout is not None and not isinstance(sock, SSLSocket):
            value = _timeval(timeout)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
            sock.settimeout(None)
            self.kernel = True
        self.reader = hiredis.Reader(
            protocolError=InvalidResponse, replyError=BaseParser.parse_error
        )
        self.poller = select.poll()
        self.poller.register(sock, _POLLIN)

    def readable(self) -> bool:
        """Whether the server sent something (or closed) while no command was out.
        A TLS socket may hold decrypted bytes the poll does not see."""
        return bool(self.poller.poll(0)) or (
            isinstance(self.sock, SSLSocket) and self.sock.pending() > 0
        )

    def close(self) -> None:
        try:
            self.connection.disconnect()
        except Exception:
            self.sock.close()


class Wire:
    """Connections of its own to ``client``'s server (see `usable`), each made on
    first need with redis-py's settings and kept while it works."""

    def __init__(self, client: redis.Redis) -> None:
        self.pool: ConnectionPool = client.connection_pool
        kwargs = self.pool.connection_kwargs
        timeout = kwargs.get("socket_timeout")
        self.timeout: float | None = None if timeout is None else float(timeout)
        self.where = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
        self._idle: list[_Link] = []  # list.pop and append are atomic: no lock
        _WIRES.add(self)

    def call(self, *args: bytes | str | int) -> Any:
        """One command and its reply; an error reply raised as redis-py's exception."""
        payload = hiredis.pack_command(args)  # type: ignore[arg-type]  # its stub says a 1-tuple
        try:
            link = self._idle.pop()
        except IndexError:
            link = self._connect()
        else:
            if link.readable():  # closed by the server, or garbage: a new one
                link.close()
                link = self._connect()
        reply = self._round_trip(link, payload)
        if link.reader.has_data():  # more than was asked for: no longer trusted
            link.close()
        else:
            self._idle.append(link)
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    def _round_trip(self, link: _Link, payload: bytes) -> Any:
        sock, reader, timeout = link.sock, link.reader, self.timeout
        started = time.monotonic()
        shortened = False
        try:
            try:
                sock.sendall(payload)
                data = sock.recv(_CHUNK)
                while True:
                    if not data:
                        raise RedisConnectionError(
                            f"Error while reading from {self.where} : Connection closed by server."
                        )
                    reader.feed(data)
                    if (reply := reader.gets()) is not False:
                        return reply
                    if timeout is not None:  # the rest of the round trip's time, not more
                        left = started + timeout - time.monotonic()
                        if left <= 0:
                            raise TimeoutError
                        if link.kernel:
                            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(left))
                        else:
                            sock.settimeout(left)
                        shortened = True
                    data = sock.recv(_CHUNK)
            finally:
                if shortened and timeout is not None:
                    if link.kernel:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(timeout))
                    else:
                        sock.settimeout(timeout)
        # socket.timeout is TimeoutError; a kernel timeout on a blocking socket says
        # EAGAIN, which Python raises as BlockingIOError
        except (TimeoutError, BlockingIOError) as exc:
            link.close()
            raise RedisTimeoutError(f"Timeout reading from {self.where}") from exc
        except InvalidResponse as exc:
            link.close()
            raise RedisConnectionError(f"Protocol error from {self.where}: {exc}") from exc
        except OSError as exc:
            link.close()
            raise RedisConnectionError(f"Error while talking to {self.where}: {exc}") from exc
        except BaseException:  # the connection's state is unknown: not used again
            link.close()
            raise

    def _connect(self) -> _Link:
        connection: Any = self.pool.make_connection()
        connection.connect()  # redis-py's: socket, TLS, AUTH, SELECT, each step timed
        sock = getattr(connection, "_sock", None)
        if not isinstance(sock, socket.socket):
            connection.disconnect()
            raise Unsupported(f"cannot take over redis-py's connection {connection!r}")
        return _Link(connection, sock, self.timeout)

    def close(self) -> None:
        """Close the idle connections (one in use closes when it fails, or stays idle
        for the next call)."""
        while self._idle:
            try:
                self._idle.pop().close()
            except IndexError:  # another thread took the last
                break

    def _forget(self) -> None:
        """In a forked child: the parent's connections are not this process's to use
        (nor to close: closing would shut them down for the parent)."""
        self._idle = []

    def __repr__(self) -> str:
        return f"<Wire {len(self._idle)} idle {self.where}>"


_WIRES: weakref.WeakSet[Wire] = weakref.WeakSet()


def _after_fork() -> None:
    for wire in list(_WIRES):
        wire._forget()


os.register_at_fork(after_in_child=_after_fork)
