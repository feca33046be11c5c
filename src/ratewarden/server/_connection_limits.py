"""What one client may hold of the service: connections, time and bytes.

Both listeners (the HTTP API under uvicorn and the HTTP/2 gRPC server) take the
same `ConnectionLimits`, so an operator sets one policy for the process and a
client that is slow, idle or large on purpose is closed the same way on either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from .._errors import ConfigurationError

__all__ = ["ConnectionLimits"]


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
    """

    max_connections: int = 10_000
    idle_timeout: float = 60.0
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_header_bytes: int = 16 * 1024

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
