"""Rate limiting for Django, sync and async (``pip install ratewarden[django]``).

    # settings.py
    MIDDLEWARE = [..., "ratewarden.integrations.django.RateLimitMiddleware"]
    RATEWARDEN = {
        "ENGINE": "myproject.limits.engine",       # a RuleEngine/AsyncRuleEngine, or its path
        "IDENTIFY": "myproject.limits.identify",   # optional: request -> {"user": ...}
        "HEADERS": "all",                          # or "denied", "none"
    }

    # views.py: a view's own limits (sync or async views)
    @limit(export_engine)
    async def export(request): ...

The middleware is sync- and async-capable: Django runs it the way its handler
runs, so an ASGI deployment never hops threads for it. Either engine works in
either mode: an `AsyncRuleEngine` is awaited (or run to completion from sync
code); a sync `RuleEngine` runs as it is under WSGI, and under ASGI inline on
a `MemoryStore` but on a worker thread for other stores and for delays, so
nothing that blocks or sleeps stalls the event loop.

A rule file's concurrency rules hold their slots from before the view runs until
Django closes the response (its handlers do once it is sent, a streaming body's
last chunk too, or once the client went away), under WSGI and ASGI alike.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from asgiref.sync import async_to_sync, iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.utils.module_loading import import_string

from ..primitives import ConfigurationError
from ..rules import AsyncRuleEngine, Outcome, RuleEngine
from ..stores import AsyncMemoryStore
from ._request import (
    DEGRADE,
    HeaderMode,
    IdentifyFailures,
    Reply,
    Responder,
    attributes,
    check_any_engine,
    content_length,
    identity_of,
)
from ._slots import aadmit, agive_back, give_back, holds_slots
from .asgi import run_engine
from .wsgi import EnvironHeaders, admitted, log

__all__ = ["RateLimitMiddleware", "limit", "request_attributes"]

Engine = RuleEngine | AsyncRuleEngine
IdentifyRequest = Callable[[HttpRequest], "Mapping[str, object] | None"]
Handler = Callable[[HttpRequest], Any]


def request_attributes(
    request: HttpRequest, identity: Mapping[str, object] | None
) -> dict[str, object]:
    """The rule attributes of a Django request; ``route`` (``items/<int:id>``, as
    Django writes it) once URL resolution has happened, i.e. in a view decorator."""
    match = getattr(request, "resolver_match", None)
    route = getattr(match, "route", None) or None
    meta = request.META
    return attributes(
        request.method or "GET",
        request.path,
        meta.get("REMOTE_ADDR"),
        EnvironHeaders(meta),
        body_size=content_length(meta.get("CONTENT_LENGTH")),
        identity=identity,
        route=route,
    )


def _sync_can_run(engine: Engine) -> None:
    """A sync request runs an `AsyncRuleEngine` through ``async_to_sync``, a new
    event loop each time: fine for the memory store, but a Redis client's
    connections and batcher belong to the loop that made them, and requests
    would go through unchecked."""
    if isinstance(engine, AsyncRuleEngine) and not isinstance(engine.store, AsyncMemoryStore):
        raise ConfigurationError(
            "a sync Django view or middleware cannot run an AsyncRuleEngine on "
            f"{type(engine.store).__name__}: use a RuleEngine with RedisStore there"
        )


def _check_sync(engine: Engine, attrs: Mapping[str, object], identified: bool) -> Outcome | None:
    try:
        if isinstance(engine, AsyncRuleEngine):
            acheck = engine.acheck if identified else engine.aunidentified
            return async_to_sync(acheck)(attrs, wait=True)
        if not identified:
            return engine.unidentified(attrs, wait=True)
        return engine.check(attrs, wait=True)
    except Exception:
        log.exception("rate limiter failed; the request goes through unchecked")
        return None


async def _check_async(
    engine: Engine, attrs: Mapping[str, object], identified: bool
) -> Outcome | None:
    try:
        return await run_engine(engine, attrs, identified)
    except Exception:
        log.exception("rate limiter failed; the request goes through unchecked")
        return None


Release = Callable[[], None]


def _admit_sync(
    engine: Engine, attrs: Mapping[str, object], identified: bool
) -> tuple[Outcome | None, Release | None]:
    """`_check_sync` with the slots of the concurrency rules: the outcome, and what
    releases the slots an allowed request holds (from any thread but the loop's)."""
    if isinstance(engine, RuleEngine):
        outcome, token = admitted(engine, attrs, identified)
        return outcome, None if token is None else functools.partial(give_back, engine, token)
    try:
        admission = async_to_sync(engine.aacquire)(attrs, wait=True, identified=identified)
    except Exception:
        log.exception("rate limiter failed; the request goes through unchecked")
        return None, None
    return admission.outcome, _releaser(engine, admission.token)


async def _admit_async(
    engine: Engine, attrs: Mapping[str, object], identified: bool
) -> tuple[Outcome | None, str | None]:
    """`_check_async` with the slots: the outcome and their token."""
    try:
        admission = await aadmit(engine, attrs, identified)
    except Exception:
        log.exception("rate limiter failed; the request goes through unchecked")
        return None, None
    return admission.outcome, admission.token


def _releaser(engine: Engine, token: str | None) -> Release | None:
    """What releases ``token``'s slots from sync code: Django closes a response
    on a thread of the server's (WSGI) or of ``sync_to_async`` (ASGI), never on the
    event loop's, so an `AsyncRuleEngine`'s release goes back to the loop."""
    if token is None:
        return None
    if isinstance(engine, RuleEngine):
        return functools.partial(give_back, engine, token)
    return functools.partial(async_to_sync(agive_back), engine, token)


def _holding(response: HttpResponseBase, release: Release) -> HttpResponseBase:
    """``response``, releasing the request's slots when it is closed: Django's
    handlers close it once it is sent (a streaming body's last chunk too), or
    once the client went away while it was sent, under WSGI and ASGI alike."""
    close = response.close
    held = [release]

    def close_and_release() -> None:
        try:
            close()
        finally:
            if held:  # closed once, released once
                held.pop()()

    response.close = close_and_release  # type: ignore[method-assign]
    return response


def _http_response(reply: Reply) -> HttpResponse:
    return HttpResponse(reply.body, status=reply.status, headers=dict(reply.headers))


def _with_headers(response: HttpResponseBase, extra: list[tuple[str, str]]) -> HttpResponseBase:
    for name, value in extra:
        response.headers[name] = value
    return response


class _Limits:
    """An engine, how to identify callers and how to answer: the part of the
    middleware and the decorator that does no I/O."""

    def __init__(
        self,
        engine: object,
        identify: IdentifyRequest | None,
        responder: Responder,
    ) -> None:
        self.engine: Engine = check_any_engine(engine, "ratewarden")
        self.identify = identify
        self.identify_failures = IdentifyFailures()
        self.responder = responder

    def attributes(self, request: HttpRequest) -> tuple[dict[str, object], bool]:
        """The request's attributes, and whether ``identify`` gave its identity
        (one that raises is logged; the engine's ``unidentified`` decides)."""
        identity, identified = identity_of(self.identify, request, self.identify_failures)
        return request_attributes(request, identity), identified

    def before(
        self, outcome: Outcome | None, request: HttpRequest
    ) -> HttpResponse | list[tuple[str, str]]:
        """A refusal to answer now, or the headers for the response to come; an
        allowed request carries how much to degrade as
        ``request.ratewarden_degrade`` (the stronger, when the middleware and a
        view's own limits have both spoken)."""
        if outcome is None:
            return []
        if not outcome.allowed:
            return _http_response(self.responder.refused(outcome))
        setattr(request, DEGRADE, max(getattr(request, DEGRADE, 0.0), outcome.degrade))
        return self.responder.passed(outcome)

    def run(self, request: HttpRequest, handler: Handler) -> HttpResponseBase:
        if not holds_slots(self.engine):
            verdict = self.before(_check_sync(self.engine, *self.attributes(request)), request)
            if isinstance(verdict, HttpResponse):
                return verdict
            return _with_headers(handler(request), verdict)
        outcome, release = _admit_sync(self.engine, *self.attributes(request))
        verdict = self.before(outcome, request)
        if isinstance(verdict, HttpResponse):
            return verdict
        if release is None:
            return _with_headers(handler(request), verdict)
        try:
            response = handler(request)
        except BaseException:
            release()
            raise
        return _holding(_with_headers(response, verdict), release)

    async def arun(
        self, request: HttpRequest, handler: Callable[[HttpRequest], Awaitable[Any]]
    ) -> HttpResponseBase:
        if not holds_slots(self.engine):
            outcome = await _check_async(self.engine, *self.attributes(request))
            verdict = self.before(outcome, request)
            if isinstance(verdict, HttpResponse):
                return verdict
            return _with_headers(await handler(request), verdict)
        outcome, token = await _admit_async(self.engine, *self.attributes(request))
        verdict = self.before(outcome, request)
        if isinstance(verdict, HttpResponse):
            return verdict
        release = _releaser(self.engine, token)
        if token is None or release is None:
            return _with_headers(await handler(request), verdict)
        try:
            response = await handler(request)
        except BaseException:  # cancelled too: the client went away before the response
            await agive_back(self.engine, token)
            raise
        return _holding(_with_headers(response, verdict), release)


def _from_settings() -> _Limits:
    config: dict[str, Any] = dict(getattr(settings, "RATEWARDEN", {}))
    engine = config.get("ENGINE")
    if engine is None:
        raise ConfigurationError("settings.RATEWARDEN['ENGINE'] is missing: the rule engine")
    if isinstance(engine, str):
        engine = import_string(engine)
    identify = config.get("IDENTIFY")
    if isinstance(identify, str):
        identify = import_string(identify)
    responder = Responder(
        config.get("HEADERS", "all"),
        legacy=config.get("LEGACY", True),
        ietf=config.get("IETF", True),
    )
    return _Limits(engine, identify, responder)


class RateLimitMiddleware:
    """Checks every request against the engine in ``settings.RATEWARDEN``
    (``ENGINE``, optional ``IDENTIFY``, ``HEADERS``, ``LEGACY``, ``IETF``), as the
    ASGI middleware does, before URL resolution (so without ``route``: use `limit`
    on a view for limits by route)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response
        self.limits = _from_settings()
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
        else:
            _sync_can_run(self.limits.engine)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.limits.arun(request, self.get_response)
        return self.limits.run(request, self.get_response)


def limit(
    engine: Engine,
    *,
    identify: IdentifyRequest | None = None,
    headers: HeaderMode = "all",
    legacy: bool = True,
    ietf: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A view decorator for a view's own limits, sync or async views alike; the
    rules see the view's ``route``."""
    limits = _Limits(engine, identify, Responder(headers, legacy=legacy, ietf=ietf))

    def decorate(view: Callable[..., Any]) -> Callable[..., Any]:
        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_limited(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                async def call(request: HttpRequest) -> Any:
                    return await view(request, *args, **kwargs)

                return await limits.arun(request, call)

            return async_limited

        _sync_can_run(limits.engine)

        @functools.wraps(view)
        def limited(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            return limits.run(request, lambda request: view(request, *args, **kwargs))

        return limited

    return decorate
