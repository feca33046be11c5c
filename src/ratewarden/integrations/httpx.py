"""Obey someone else's limit with httpx (``pip install ratewarden[httpx]``).

    limiter = Limiter("10/second", algorithm="gcra", name="partner")
    transport = RateLimitTransport(limiter, max_wait=5.0)
    with httpx.Client(transport=transport) as client:
        client.get("https://api.partner.example/orders")   # waits for a permit

Each request first takes a permit for its key (the host, or ``key(request)``)
with ``acquire``: waiting up to ``max_wait`` (``math.inf``: as long as it takes,
``0``: fail at once), then `RateLimitTimeout`. A 429 or 503 answer with
``Retry-After`` pauses that key until then (a 429 without it: ``default_pause``
seconds), so later requests wait instead of piling up more refusals; the
response itself is returned as it came. `AsyncRateLimitTransport` is the asyncio
twin, for an `AsyncLimiter`.

A fleet quota (`ratewarden.fleet.FleetQuota`, `AsyncFleetQuota`) takes the
limiter's place to share one provider's limit across every instance: one
permit pool for every key, and a 429 reported to it (``observe``) lowers an
adaptive total.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Generic, TypeVar

import httpx

from ..kernel import AsyncLimiter, Limiter
from ._consumer import AsyncQuota, Pauses, Quota, clock_of, observe

__all__ = ["AsyncRateLimitTransport", "RateLimitTransport", "host_key"]

KeyFn = Callable[[httpx.Request], str]
Q = TypeVar("Q", Limiter | Quota, AsyncLimiter | AsyncQuota)
T = TypeVar("T", httpx.BaseTransport, httpx.AsyncBaseTransport)


def host_key(request: httpx.Request) -> str:
    """The default key: the host the request goes to."""
    return request.url.host


class _Transport(Generic[Q, T]):
    """What the two transports share: their options, and what an answer does.
    Each names the transport it wraps by default."""

    limiter: Q
    transport: T
    _transport_class: type[T]

    def __init__(
        self,
        limiter: Q,
        transport: T | None = None,
        *,
        max_wait: float,
        key: KeyFn = host_key,
        pause_on: Collection[int] = (429, 503),
        default_pause: float = 1.0,
    ) -> None:
        self.limiter = limiter
        self.transport = self._transport_class() if transport is None else transport
        self.key = key
        self.pauses = Pauses(
            clock_of(limiter), max_wait=max_wait, pause_on=pause_on, default_pause=default_pause
        )

    def _answered(self, key: str, response: httpx.Response) -> httpx.Response:
        """Tell a fleet quota the status, and pause ``key`` if the provider asks."""
        observe(self.limiter, response.status_code)
        # every line of a header that comes more than once (RateLimit: one per limit)
        headers = response.headers
        self.pauses.after(key, response.status_code,
                          lambda name: ", ".join(headers.get_list(name)) or None)  # fmt: skip
        return response


class RateLimitTransport(_Transport[Limiter | Quota, httpx.BaseTransport], httpx.BaseTransport):
    """Wraps ``transport`` (default `httpx.HTTPTransport()`) with a permit from
    ``limiter`` before each request (see the module docstring)."""

    _transport_class = httpx.HTTPTransport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        key = self.key(request)
        self.pauses.permit(self.limiter, key)
        with self.pauses.sending(key):
            response = self.transport.handle_request(request)
        return self._answered(key, response)

    def close(self) -> None:
        self.transport.close()


class AsyncRateLimitTransport(
    _Transport[AsyncLimiter | AsyncQuota, httpx.AsyncBaseTransport], httpx.AsyncBaseTransport
):
    """The asyncio twin of `RateLimitTransport`, for an `AsyncLimiter`; waiting
    never blocks the event loop."""

    _transport_class = httpx.AsyncHTTPTransport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        key = self.key(request)
        await self.pauses.apermit(self.limiter, key)
        with self.pauses.sending(key):
            response = await self.transport.handle_async_request(request)
        return self._answered(key, response)

    async def aclose(self) -> None:
        await self.transport.aclose()
