"""Obey someone else's limit with aiohttp (``pip install ratewarden[aiohttp]``).

    limiter = AsyncLimiter("10/second", algorithm="gcra", name="partner")
    async with aiohttp.ClientSession(
        middlewares=[RateLimitMiddleware(limiter, max_wait=5.0)]
    ) as session:
        async with session.get("https://api.partner.example/orders") as response: ...

A client middleware (aiohttp >= 3.12): each request first awaits a permit for
its key (the host, or ``key(request)``) within ``max_wait``, else
`RateLimitTimeout`; a 429 or 503 with ``Retry-After`` pauses that key, as the
httpx transports do. Waiting never blocks the event loop. An
`AsyncFleetQuota` (``ratewarden.fleet``) may take the limiter's place.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from aiohttp import ClientHandlerType, ClientRequest, ClientResponse

from ..kernel import AsyncLimiter
from ._consumer import AsyncQuota, Pauses, clock_of, observe

__all__ = ["RateLimitMiddleware", "host_key"]

KeyFn = Callable[[ClientRequest], str]


def host_key(request: ClientRequest) -> str:
    """The default key: the host the request goes to."""
    return request.url.host or ""


class RateLimitMiddleware:
    """An aiohttp client middleware taking a permit from ``limiter`` (an
    `AsyncLimiter`) before each request; see the module docstring."""

    def __init__(
        self,
        limiter: AsyncLimiter | AsyncQuota,
        *,
        max_wait: float,
        key: KeyFn = host_key,
        pause_on: Collection[int] = (429, 503),
        default_pause: float = 1.0,
    ) -> None:
        self.limiter = limiter
        self.key = key
        self.pauses = Pauses(
            clock_of(limiter), max_wait=max_wait, pause_on=pause_on, default_pause=default_pause
        )

    async def __call__(self, request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        key = self.key(request)
        await self.pauses.apermit(self.limiter, key)
        with self.pauses.sending(key):
            response = await handler(request)
        observe(self.limiter, response.status)
        # every line of a header that comes more than once (RateLimit: one per limit)
        headers = response.headers

        def header(name: str) -> str | None:
            return ", ".join(headers.getall(name, ())) or None

        self.pauses.after(key, response.status, header)
        return response
