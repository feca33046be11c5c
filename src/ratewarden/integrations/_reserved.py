"""The ASGI middleware's ``reserve`` option: a request's cost known only after
its response (LLM tokens, bytes, rows) reserved before the app runs and
settled after it.

The estimate comes from the request (``estimate(scope)``: a number, or None to
use the limiter's learned estimate of ``profile(scope)``); the actual cost from
the response, as the app says it: the ``actual_header`` response header (e.g.
``x-tokens-used``), or ``scope["state"]["ratewarden_cost"]`` set by the app
(Starlette and FastAPI: ``request.state.ratewarden_cost = n``). A response that
says neither leaves the estimate charged; a request the app fails (an
exception, a cancellation) is settled at what it said by then, else charged at
its estimate too: the call may have been made.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ..kernel import AsyncLimiter, AsyncReservation, ReservationError
from ._request import Reply, retry_seconds, too_many

# the ASGI shapes, as `asgi` names them (which imports this module)
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

__all__ = ["Reserved"]

log = logging.getLogger("ratewarden.integrations")

STATE_KEY = "ratewarden_cost"


class Reserved:
    """What the ``reserve`` option holds: the limiter, the key, where the
    estimate and the actual cost come from."""

    __slots__ = ("actual_header", "estimate", "key", "limiter", "profile")

    def __init__(
        self,
        limiter: AsyncLimiter,
        key: str | Callable[[Scope], str],
        *,
        estimate: int | Callable[[Scope], int | None] | None = None,
        profile: str | Callable[[Scope], str] | None = None,
        actual_header: str | None = None,
    ) -> None:
        if not isinstance(limiter, AsyncLimiter):
            raise TypeError(f"reserve takes an AsyncLimiter, got {type(limiter).__name__}")
        if estimate is None and profile is None:
            raise TypeError("reserve needs estimate (a number, or estimate(scope)), or profile"
                            " (a name, or profile(scope)) for a learned one")  # fmt: skip
        self.limiter = limiter
        self.key = _per_request("key", key, str)
        self.estimate = None if estimate is None else _per_request("estimate", estimate, int)
        self.profile = None if profile is None else _per_request("profile", profile, str)
        self.actual_header = None if actual_header is None else actual_header.lower().encode()

    async def run(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> Reply | None:
        """Runs ``app`` within a reservation; a `Reply` (429) when it is denied."""
        try:
            cost = None if self.estimate is None else self.estimate(scope)
            profile = None if cost is not None or self.profile is None else self.profile(scope)
            reservation = await self.limiter.reserve(self.key(scope), cost, profile=profile)
        except Exception:
            log.exception("reservation failed; the request goes through unreserved")
            await app(scope, receive, send)
            return None
        if not reservation:
            return _denied(reservation)
        said: list[int] = []

        async def reading(message: Message) -> None:
            if message["type"] == "http.response.start" and self.actual_header is not None:
                for name, value in message.get("headers", ()):
                    if name.lower() == self.actual_header:
                        number = _number(value)
                        if number is not None:
                            said.append(number)
            await send(message)

        try:
            await app(scope, receive, reading)
        finally:
            state = scope.get("state")
            told = state.get(STATE_KEY) if isinstance(state, dict) else None
            actual = told if type(told) is int and told >= 0 else (said[-1] if said else None)
            if actual is not None:
                await self._settle(reservation, actual)
        return None

    async def _settle(self, reservation: AsyncReservation, actual: int) -> None:
        try:
            await reservation.settle(actual)
        except ReservationError as exc:
            log.warning("%s", exc)
        except Exception:  # the store: the estimate stays charged
            log.exception("settling a reservation failed; its estimate stays charged")


def _per_request(name: str, given: Any, kind: type) -> Callable[[Scope], Any]:
    """``given`` as a function of the request's scope: a function as it is, a
    value of ``kind`` as the same value for every request."""
    if callable(given):
        return given  # type: ignore[no-any-return]
    if isinstance(given, kind) and not isinstance(given, bool):
        return lambda scope: given
    raise TypeError(
        f"{name} is a {kind.__name__} or a function of the request's scope, got {given!r}"
    )


def _number(raw: bytes) -> int | None:
    try:
        value = int(raw.decode("latin-1").strip())
    except ValueError:
        return None
    return value if value >= 0 else None


def _denied(reservation: AsyncReservation) -> Reply:
    wait = retry_seconds(reservation.retry_after)
    return too_many(wait, f"over the budget of {reservation.limit}; retry in {wait} s")
