"""Route-specific limits for FastAPI: a dependency (``pip install ratewarden[fastapi]``).

    from fastapi import Depends, FastAPI
    from .fastapi import RateLimit, install

    search_limit = RateLimit(AsyncRuleEngine("search-rules.yaml", AsyncMemoryStore()))
    app = FastAPI()
    install(app)                                   # problem+json bodies for refusals

    @app.get("/search", dependencies=[Depends(search_limit)])
    async def search(q: str) -> list[str]: ...

The dependency runs after routing, so the ``route`` attribute (``/items/{id}``)
is known to the rules. For app-wide limits use the ASGI `RateLimitMiddleware`
(``app.add_middleware(RateLimitMiddleware, engine=...)``): it answers before
FastAPI parses anything, which is cheaper for requests it refuses.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import msgspec
from fastapi import FastAPI, Request, Response
from starlette.exceptions import HTTPException

from ..rules import AsyncRuleEngine, Outcome, RuleEngine
from ._request import (
    DEGRADE,
    ROUTE_SPOKE,
    HeaderMode,
    IdentifyFailures,
    Reply,
    Responder,
    check_any_engine,
)
from .asgi import aidentity_of, log, run_engine, scope_attributes, tell_degrade

__all__ = ["RateLimit", "RateLimited", "install", "rate_limited_handler"]

IdentifyRequest = Callable[
    [Request], "Mapping[str, object] | Awaitable[Mapping[str, object] | None] | None"
]


class RateLimited(HTTPException):
    """Raised by `RateLimit` to refuse a request; ``reply`` is the answer. A
    Starlette HTTPException, so even without `install` FastAPI answers with the
    right status and headers (its own ``{"detail": ...}`` body around the problem)."""

    def __init__(self, reply: Reply) -> None:
        detail = msgspec.json.decode(reply.body) if reply.body.startswith(b"{") else None
        super().__init__(reply.status, detail=detail, headers=dict(reply.headers))
        self.reply = reply


async def rate_limited_handler(request: Request, exc: Exception) -> Response:
    """Answers a `RateLimited` with its reply as it is (problem+json, or a shadow
    ban's configured response)."""
    if not isinstance(exc, RateLimited):  # registered for RateLimited only
        raise exc
    reply = exc.reply
    return Response(reply.body, status_code=reply.status, headers=dict(reply.headers))


def install(app: FastAPI) -> None:
    """Register `rate_limited_handler` on ``app``."""
    app.add_exception_handler(RateLimited, rate_limited_handler)


class RateLimit:
    """A dependency checking the request against ``engine`` (an `AsyncRuleEngine`,
    or a sync `RuleEngine` as `ratewarden.integrations.asgi.run_engine` runs it).

    Allowed: the rate-limit headers go on the response (``headers`` as for the
    middleware; FastAPI copies them onto what the endpoint returns unless the
    endpoint returns a Response of its own) and the `Outcome` is the dependency's
    value. Delays are waited out without blocking the loop. Refused (reject or
    shadow ban): raises `RateLimited`. ``identify(request)``, plain or async, adds
    the attributes only the application knows; one that raises is logged and
    the request decided without its identity, as the middleware does. A limiter
    that fails lets the request through (logged), as the middleware does.

    A concurrency rule's rates count here, but not its slots: a dependency has no
    point that is reached once the response is sent, whatever FastAPI's version,
    so a slot it took would outlive the request or end before it; the ASGI
    middleware holds them (docs/concurrency.md, "Which middleware holds the slots").
    """

    def __init__(
        self,
        engine: AsyncRuleEngine | RuleEngine,
        *,
        identify: IdentifyRequest | None = None,
        headers: HeaderMode = "all",
        legacy: bool = True,
        ietf: bool = True,
    ) -> None:
        self.engine = check_any_engine(engine, "RateLimit")
        self.identify = identify
        self.identify_failures = IdentifyFailures()
        self.responder = Responder(headers, legacy=legacy, ietf=ietf)

    async def __call__(self, request: Request, response: Response) -> Outcome | None:
        identity, identified = await aidentity_of(self.identify, request, self.identify_failures)
        try:
            attributes = scope_attributes(request.scope, identity)
            outcome = await run_engine(self.engine, attributes, identified)
        except Exception:
            log.exception("rate limiter failed; the request goes through unchecked")
            return None
        if outcome.allowed:
            level = request.scope.get("state", {}).get(DEGRADE, 0.0)
            tell_degrade(request.scope, max(level, outcome.degrade))
            extra = self.responder.passed(outcome)
            for name, value in extra:
                response.headers.append(name, value)
            if extra:
                request.scope[ROUTE_SPOKE] = True  # an app-wide middleware adds none
            return outcome
        request.scope[ROUTE_SPOKE] = True
        raise RateLimited(self.responder.refused(outcome))

    def __repr__(self) -> str:
        return f"<RateLimit {self.engine!r}>"
