"""The HTTP server: `HttpServer` serves an ASGI app on a listening socket with
`HttpConnection`s sharing one `HttpListener`, and drains it: the socket closes,
idle keep-alive connections close at once, the others after the answers to what
they have read, and whatever still runs when the drain's time is up is
cancelled and its connection dropped.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from ._connection_limits import ConnectionLimits, ServerLimits
from ._http import HttpConnection
from ._http_cycle import App
from ._http_listener import HttpListener

__all__ = ["HttpListener", "HttpServer"]  # the listener: its own module's

log = logging.getLogger("ratewarden.server")


class HttpServer:
    """``app`` served over HTTP/1.1 on a listening socket, within ``limits``."""

    def __init__(
        self,
        app: App,
        sock: socket.socket,
        limits: ConnectionLimits,
        max_body: int,
        server_limits: ServerLimits | None = None,
    ) -> None:
        self.app = app
        self.sock = sock
        self.address = sock.getsockname()  # the socket is closed with the server
        self.listener = HttpListener(limits, max_body, server_limits)
        self._server: asyncio.AbstractServer | None = None

    def __repr__(self) -> str:
        return f"<HttpServer {self.address!r} {self.listener!r}>"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        listener, app = self.listener, self.app

        def connection() -> HttpConnection:
            return HttpConnection(listener, app)

        self._server = await loop.create_server(connection, sock=self.sock, backlog=2048)

    async def drain(self, timeout: float) -> None:
        """Stop accepting, then let the connections finish (`HttpListener.drain`)."""
        if self._server is not None:
            self._server.close()
        await self.listener.drain(timeout)

    def close(self) -> None:
        """Drop every connection at once (after a drain, there are none)."""
        if self._server is not None:
            self._server.close()
        for connection in list(self.listener.connections):
            if connection.task is not None:
                connection.task.cancel()
            connection.transport.abort()

    @property
    def port(self) -> int:
        return int(self.address[1])
