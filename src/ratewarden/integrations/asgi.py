"""Rate limiting for any ASGI application (Starlette, FastAPI, Quart, ...).

    from .. import AsyncMemoryStore
    from .asgi import RateLimitMiddleware
    from ..rules import AsyncRuleEngine

    engine = AsyncRuleEngine("rules.yaml", AsyncMemoryStore())
    app = RateLimitMiddleware(app, engine, identify=lambda scope: {"user": ...})
    app = RateLimitMiddleware(app, AsyncLimiter("100/minute"))   # per client address

A plain ASGI class, not Starlette's ``BaseHTTPMiddleware`` (which runs the app in
another task and breaks context variables): per request it builds the rule
attributes, awaits the engine once and either calls the app, adding the
rate-limit headers to its response, or answers in its place. No framework is
imported: this module needs no extra, and with a plain limiter not even the rule
engine's (PyYAML).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from functools import partial
from typing import TYPE_CHECKING, Any

from ..kernel import AsyncConcurrencyLimiter, AsyncLimiter, Limiter, Policy, check_max_wait
from ..primitives import LeaseNotHeld, RateLimitTimeout
from ..stores import MemoryStore
from ._request import (
    DEGRADE,
    ROUTE_SPOKE,
    HeaderMode,
    IdentifyFailures,
    Identity,
    LimitOutcome,
    Reply,
    Responder,
    Settled,
    attributes,
    check_any_engine,
    content_length,
    limit_policy,
    mapping_or_none,
    retry_seconds,
    too_many,
)
from ._reserved import Reserved
from ._slots import aadmit, agive_back, holds_slots

if TYPE_CHECKING:
    from ..rules import AsyncRuleEngine, Outcome, RuleEngine

__all__ = [
    "ASGIApp",
    "RateLimitMiddleware",
    "Reserved",
    "Scope",
    "aidentity_of",
    "scope_attributes",
    "scope_headers",
    "send_reply",
    "tell_degrade",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
IdentifyScope = Callable[
    [Scope], "Mapping[str, object] | Awaitable[Mapping[str, object] | None] | None"
]

log = logging.getLogger("ratewarden.integrations")


def scope_headers(scope: Scope) -> dict[str, str]:
    """An HTTP scope's headers by name (ASGI names are lower-case already); a
    repeated header's values joined with ", ", as HTTP allows."""
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers") or ():
        name = raw_name.decode("latin-1")
        value = raw_value.decode("latin-1")
        if name in headers:
            headers[name] += ", " + value
        else:
            headers[name] = value
    return headers


class ScopeHeaders(Mapping[str, str]):
    """`scope_headers`, decoded on first use: most rule sets never read a header
    (only ``by: header:...`` and trusted proxies do), so most requests skip it."""

    __slots__ = ("_decoded", "_scope")

    def __init__(self, scope: Scope) -> None:
        self._scope = scope
        self._decoded: dict[str, str] | None = None

    def _all(self) -> dict[str, str]:
        if self._decoded is None:
            self._decoded = scope_headers(self._scope)
        return self._decoded

    def __getitem__(self, name: str) -> str:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


def scope_attributes(scope: Scope, identity: Mapping[str, object] | None) -> dict[str, object]:
    """The rule attributes of an HTTP scope (see `_request.attributes`). The route
    template is known once a router has matched (``scope["route"]``, as Starlette
    and FastAPI set it): so inside a route's own middleware or dependency."""
    client = scope.get("client")
    route = getattr(scope.get("route"), "path", None)
    length = None
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            length = content_length(value)
            break
    return attributes(
        scope.get("method", "GET"),
        scope.get("path", "/"),
        client[0] if client else None,
        ScopeHeaders(scope),
        body_size=length,
        identity=identity,
        route=route if isinstance(route, str) else None,
    )


async def aidentity_of(
    identify: Callable[[Any], object] | None, request: object, failures: IdentifyFailures
) -> Identity:
    """`_request.identity_of` for an ``identify`` that may be async."""
    if identify is None:
        return None, True
    try:
        identity = identify(request)
        if inspect.isawaitable(identity):
            identity = await identity
        return mapping_or_none(identity), True
    except Exception as exc:
        failures.failed(exc)
        return None, False


async def run_engine(
    engine: AsyncRuleEngine | RuleEngine, attributes: Mapping[str, object], identified: bool = True
) -> Outcome:
    """The engine's outcome, delays waited out, without blocking the event loop:
    an `AsyncRuleEngine` is awaited; a sync `RuleEngine` runs inline on a
    `MemoryStore` (its lock is held for microseconds, far less than a thread
    hop), and on a worker thread for other stores (which may block) and for a
    delay (which sleeps). A delayed request counted nowhere, so checking it
    again on the thread counts it once. Not ``identified``: the engine's
    ``unidentified`` decides."""
    from ..rules import AsyncRuleEngine, await_out  # noqa: PLC0415 (an engine imported it)

    if isinstance(engine, AsyncRuleEngine):
        if not identified:
            return await engine.aunidentified(attributes, wait=True)
        return await engine.acheck(attributes, wait=True)
    inline = isinstance(engine.store, MemoryStore)
    decide = engine.check if identified else engine.unidentified

    async def check() -> Outcome:
        if inline:
            return decide(attributes)
        return await asyncio.to_thread(decide, attributes)

    # The checks may hop to a thread; the waiting happens here, on the loop, with
    # the deadline set now: a delay never queues for one of the executor's threads.
    return await await_out(await check(), check, engine.store.clock)


async def run_limiter(
    limiter: AsyncLimiter | Limiter,
    policy: Policy,
    attributes: Mapping[str, object],
    identified: bool = True,
) -> LimitOutcome:
    """A plain limiter's hit for the client address, as `run_engine` runs a sync
    engine: inline on a `MemoryStore`, else on a worker thread. The client
    address needs no identity: ``identified`` changes nothing."""
    key = str(attributes.get("ip"))
    if isinstance(limiter, AsyncLimiter):
        decision = await limiter.hit(key)
    elif isinstance(limiter.store, MemoryStore):
        decision = limiter.hit(key)
    else:
        decision = await asyncio.to_thread(limiter.hit, key)
    return LimitOutcome(decision, policy)


def tell_degrade(scope: Scope, level: float) -> None:
    """Leave how much to degrade in ``scope["state"]`` for the application
    (Starlette: ``request.state.ratewarden_degrade``): 0.0 when it need not."""
    state = scope.get("state")
    if state is None:
        state = scope["state"] = {}
    state[DEGRADE] = level


async def send_reply(send: Send, reply: Reply) -> None:
    """Answer ``reply`` in the application's place."""
    headers = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in reply.headers]
    headers.append((b"content-length", str(len(reply.body)).encode()))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body})


class RateLimitMiddleware:
    """Checks every HTTP request against ``engine`` before ``app`` sees it;
    websocket and lifespan scopes pass straight through. The engine is an
    `AsyncRuleEngine`, or a sync `RuleEngine` (see `run_engine`: fine on a
    `MemoryStore`, a thread hop per request on Redis), or a plain `AsyncLimiter`
    or `Limiter`: one limit per client address (the ``ip`` attribute), 429 when
    over it, and no PyYAML needed.

    ``identify(scope)`` (plain or async) returns the attributes only the
    application knows (``user``, ``api_key``, ``plan``, ``org``, ...); method,
    path, peer ip, headers and body_size come from the scope. Place the middleware
    after your authentication middleware to read what it put in the scope. An
    ``identify`` that raises is logged (`IdentifyFailures`: a line per exception
    type a minute) and the request decided without its identity: each rule that
    needs it answers as its ``on_failure`` says (``fail_closed`` refuses), the
    others apply as usual.

    Per outcome: allowed, the app runs and its response gets the rate-limit
    headers (``headers="all"``; ``"denied"``: only rejections carry them,
    ``"none"``: only Retry-After); ``reject``: the rule's status (429 or 503) with
    a problem+json body; ``delay``: the request is held on the store's clock
    (``asyncio.sleep``, the loop keeps serving) and checked again, then passes or
    is rejected; ``shadow_ban``: the rule's configured response, the app never
    called; ``log_only`` rules count and show nothing; ``queue``: the request is
    held until its slot in the line falls due, then passes; ``degrade``: it
    passes, and ``scope["state"]["ratewarden_degrade"]`` says how much to
    degrade the response (0.0 to 1.0; Starlette and FastAPI:
    ``request.state.ratewarden_degrade``), with the rule's header if it names one.

    ``concurrency``: an `AsyncConcurrencyLimiter` that also bounds the requests
    in flight: a request the rate limits pass holds one of its slots (its key
    ``concurrency_key(scope)``, the client address by default) for its whole
    duration, from before the app is called until the app returns, so until a
    streaming response's last chunk is sent (and Starlette's background tasks
    have run). No slot within ``concurrency_wait`` seconds: 429 with
    Retry-After (the time until the earliest lease ends, at least 1 s).

    A rule file's concurrency rules (``concurrency: N``) bound the requests in
    flight the same way, each by its own key: with such rules in force a request
    takes a slot of each that applies (the engine's ``acquire``), holds it until
    the app returns (a streaming response's last chunk sent), raises or is
    cancelled (the client went away), and gives it back then. A slot refused
    answers as the rule says (its status, 429 or 503, with Retry-After); a
    ``delay`` rule's request waits up to its ``max_wait`` for one.

    A rule that counts by response (``count: {status: [...]}``) is settled at
    the response start, with its status, before the response goes out (an app
    that raises before it starts one settles as a 500).

    ``reserve``: a `Reserved` for a cost known only after the response (LLM
    tokens): the request reserves its estimate of a budget before the app runs,
    429 when the budget cannot hold it, and settles the actual cost the response
    says (a header, or ``request.state.ratewarden_cost``) after it; see
    `Reserved`.

    A store that cannot decide is the rule's ``on_failure`` policy's business
    (the engine answers for it); anything else the limiter raises is logged to
    ``ratewarden.integrations`` and the request let through: the limiter never
    turns a request into a 500.
    """

    def __init__(
        self,
        app: ASGIApp,
        engine: AsyncRuleEngine | RuleEngine | AsyncLimiter | Limiter,
        *,
        identify: IdentifyScope | None = None,
        headers: HeaderMode = "all",
        legacy: bool = True,
        ietf: bool = True,
        concurrency: AsyncConcurrencyLimiter | None = None,
        concurrency_key: Callable[[Scope], str] | None = None,
        concurrency_wait: float = 0.0,
        reserve: Reserved | None = None,
    ) -> None:
        self.app = app
        self.engine = engine
        self._reserved = reserve
        self._held: Held | None = None
        if concurrency is not None:
            self._held = Held(concurrency, concurrency_key or _client, concurrency_wait)
        # a plain limiter or a rule engine, told apart once here rather than per request
        self._decide: Callable[[Mapping[str, object], bool], Awaitable[Outcome | LimitOutcome]]
        self._settle: Callable[..., Awaitable[object]] | None = None  # a rule engine's
        self._engine: AsyncRuleEngine | RuleEngine | None = None  # a rule engine, for its slots
        if isinstance(engine, AsyncLimiter | Limiter):
            self._decide = partial(run_limiter, engine, limit_policy(engine))
        else:
            checked = check_any_engine(engine, "RateLimitMiddleware (ASGI)")
            self._decide = partial(run_engine, checked)
            self._settle = settle_of(checked)
            self._engine = checked
        self.identify = identify
        self.identify_failures = IdentifyFailures()
        self.responder = Responder(headers, legacy=legacy, ietf=ietf)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        outcome, slots = await self._admit(scope)
        if slots is not None and self._engine is not None:
            try:  # the slots are held until the app is done: its last chunk sent, or it raised
                await self._allowed(outcome, scope, receive, send)
            finally:  # or it was cancelled (the client went away)
                await agive_back(self._engine, slots)
            return
        if outcome is None or outcome.allowed:
            await self._allowed(outcome, scope, receive, send)
            return
        await send_reply(send, self.responder.refused(outcome))

    async def _allowed(
        self, outcome: Outcome | LimitOutcome | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Run the app for a request allowed (``outcome`` None: the limiter failed)."""
        if outcome is not None:
            tell_degrade(scope, outcome.degrade)
        extra = [] if outcome is None else self.responder.passed(outcome)
        if extra:
            send = _adding(scope, send, extra)
        app = self.app
        if self._reserved is not None:
            app = partial(self._reserved_app, self._reserved, app)
        token = getattr(outcome, "settle", None)
        if token is not None and self._settle is not None:
            settled = Settled(self._settle, token)
            send = _settling(send, settled)
        try:
            if self._held is None:
                await app(scope, receive, send)
            else:
                await self._held.run(app, scope, receive, send)
        finally:
            if token is not None and self._settle is not None:
                await settled.told(500)  # the app raised before its response started

    @staticmethod
    async def _reserved_app(
        reserved: Reserved, app: ASGIApp, scope: Scope, receive: Receive, send: Send
    ) -> None:
        refused = await reserved.run(app, scope, receive, send)
        if refused is not None:
            await send_reply(send, refused)

    async def _admit(self, scope: Scope) -> tuple[Outcome | LimitOutcome | None, str | None]:
        """`check`, or with concurrency rules in force the engine's ``acquire``:
        the outcome, and the token of the slots an allowed request holds."""
        engine = self._engine
        if engine is None or not holds_slots(engine):
            return await self.check(scope), None
        identity, identified = await aidentity_of(self.identify, scope, self.identify_failures)
        try:
            admission = await aadmit(engine, scope_attributes(scope, identity), identified)
        except Exception:
            log.exception("rate limiter failed; the request goes through unchecked")
            return None, None
        return admission.outcome, admission.token

    async def check(self, scope: Scope) -> Outcome | LimitOutcome | None:
        """The engine's outcome for ``scope``, delays waited out; None when the
        limiter failed (logged): let the request through."""
        identity, identified = await aidentity_of(self.identify, scope, self.identify_failures)
        try:
            return await self._decide(scope_attributes(scope, identity), identified)
        except Exception:
            log.exception("rate limiter failed; the request goes through unchecked")
            return None

    def __repr__(self) -> str:
        return f"<RateLimitMiddleware {self.engine!r} headers={self.responder.mode!r}>"


class Held:
    """The ``concurrency`` option: a request holds a slot while the app runs."""

    __slots__ = ("key", "limiter", "max_wait")

    def __init__(
        self, limiter: AsyncConcurrencyLimiter, key: Callable[[Scope], str], max_wait: float
    ) -> None:
        if not isinstance(limiter, AsyncConcurrencyLimiter):
            raise TypeError(
                f"concurrency must be an AsyncConcurrencyLimiter, got {type(limiter).__name__}"
            )
        check_max_wait(max_wait)  # now, not on the first request
        self.limiter, self.key, self.max_wait = limiter, key, max_wait

    async def run(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            hold = await self.limiter.hold(self.key(scope), self.max_wait).__aenter__()
        except RateLimitTimeout as exc:
            await send_reply(send, _busy(exc))
            return
        except Exception:
            log.exception("concurrency limiter failed; the request goes through unheld")
            await app(scope, receive, send)
            return
        failed: BaseException | None = None
        try:
            await app(scope, receive, send)
        except BaseException as exc:  # cancelled too: the slot comes back either way
            failed = exc
            raise
        finally:
            try:
                await hold.__aexit__(type(failed) if failed else None, failed, None)
            except LeaseNotHeld as exc:  # the response is sent: tell the log, not the client
                log.warning("%s", exc)


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


def settle_of(engine: AsyncRuleEngine | RuleEngine) -> Callable[..., Awaitable[object]]:
    """The engine's settle, awaitable: an `AsyncRuleEngine`'s, or a sync
    `RuleEngine`'s as `run_engine` runs its checks (inline on a `MemoryStore`,
    else on a worker thread)."""
    from ..rules import AsyncRuleEngine  # noqa: PLC0415 (an engine imported it)

    if isinstance(engine, AsyncRuleEngine):
        return engine.asettle
    inline = isinstance(engine.store, MemoryStore)

    async def settle(token: str, *, status: int) -> object:
        if inline:
            return engine.settle(token, status=status)
        return await asyncio.to_thread(partial(engine.settle, token, status=status))

    return settle


def _settling(send: Send, settled: Settled) -> Send:
    """``send``, settling the request's hits by its status at the response start,
    before it goes out: a client that reads the response finds its count settled."""

    async def send_settling(message: Message) -> None:
        if message["type"] == "http.response.start":
            await settled.told(int(message["status"]))
        await send(message)

    return send_settling


def _busy(exc: RateLimitTimeout) -> Reply:
    return too_many(retry_seconds(exc.retry_after), "too many requests in flight; retry later")


def _adding(scope: Scope, send: Send, extra: list[tuple[str, str]]) -> Send:
    """``send``, with ``extra`` headers added to the response start, unless a
    route's own check (the FastAPI dependency) put its own there."""
    raw = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in extra]

    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start" and not scope.get(ROUTE_SPOKE):
            message = {**message, "headers": [*message.get("headers", ()), *raw]}
        await send(message)

    return send_with_headers
