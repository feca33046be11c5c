"""Rate limiting for Flask (``pip install ratewarden[flask]``).

    limiter = RateLimiter(app, RuleEngine("rules.yaml", MemoryStore()))

    @app.get("/export")
    @limit(RuleEngine("export-rules.yaml", store))     # a view's own limits
    def export(): ...

The extension checks each request in ``before_request``, after routing, so the
rules see the ``route`` (``/items/<int:id>``); allowed responses get the
rate-limit headers on their way out (the extension wraps ``app.wsgi_app``).
The engine is the sync `RuleEngine`. A view asks `degrade_level()` how much
to degrade its response when a ``degrade`` rule says the caller is over.
A rule file's concurrency rules hold their slots until the server closes the
response (its body sent, or the client gone), for the extension and `limit`
alike.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from flask import Flask, Request, Response, make_response, request

from ..rules import Outcome, RuleEngine
from ._request import (
    DEGRADE_ENVIRON,
    ROUTE_SPOKE,
    HeaderMode,
    IdentifyFailures,
    Reply,
    Responder,
    check_engine,
    identity_of,
)
from ._slots import give_back, holds_slots
from .wsgi import Releasing, admitted, check, environ_attributes, reply_headers

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = ["RateLimiter", "degrade_level", "limit"]

P = ParamSpec("P")
T = TypeVar("T")
IdentifyRequest = Callable[[Request], "Mapping[str, object] | None"]
_KEY = "ratewarden.headers"
_SLOTS = "ratewarden.slots"  # what releases the slots the extension's check took


def _outcome(
    engine: RuleEngine,
    identify: IdentifyRequest | None,
    failures: IdentifyFailures,
    current: Request,
) -> tuple[Outcome | None, Callable[[], None] | None]:
    """The request's outcome, and with concurrency rules in force what releases
    the slots it holds (None: it holds none)."""
    identity, identified = identity_of(identify, current, failures)
    rule = current.url_rule
    attributes = environ_attributes(current.environ, identity, None if rule is None else rule.rule)
    if not holds_slots(engine):
        return check(engine, attributes, identified), None
    outcome, slots = admitted(engine, attributes, identified)
    return outcome, None if slots is None else functools.partial(give_back, engine, slots)


def _tell_degrade(outcome: Outcome | None) -> None:
    """Leave the level in the environ; the stronger of the extension's and a
    view's own, when both have spoken."""
    if outcome is not None and outcome.allowed:
        environ = request.environ
        environ[DEGRADE_ENVIRON] = max(environ.get(DEGRADE_ENVIRON, 0.0), outcome.degrade)


def degrade_level() -> float:
    """How much to degrade the current request's response: 0.0 (not at all) to
    1.0, as the limits' ``degrade`` rules said (0.0 when no limit was checked)."""
    return float(request.environ.get(DEGRADE_ENVIRON, 0.0))


def _response(reply: Reply) -> Response:
    return Response(reply.body, status=reply.status, headers=reply_headers(reply))


class RateLimiter:
    """The Flask extension: every request of ``app`` checked against ``engine``.

    ``identify(request)`` returns what only the application knows (user,
    api_key, plan, org, ...); ``headers``, ``legacy``, ``ietf``, the handling
    of each action and of an ``identify`` that raises are as for the ASGI
    middleware. ``init_app`` for the app factory pattern.
    """

    def __init__(
        self,
        app: Flask | None = None,
        engine: RuleEngine | None = None,
        *,
        identify: IdentifyRequest | None = None,
        headers: HeaderMode = "all",
        legacy: bool = True,
        ietf: bool = True,
    ) -> None:
        self.engine = None if engine is None else check_engine(engine, RuleEngine, "RateLimiter")
        self.identify = identify
        self.identify_failures = IdentifyFailures()
        self.responder = Responder(headers, legacy=legacy, ietf=ietf)
        if app is not None:
            self.init_app(app, engine)

    def init_app(self, app: Flask, engine: RuleEngine | None = None) -> None:
        if engine is not None:
            self.engine = check_engine(engine, RuleEngine, "RateLimiter")
        if self.engine is None:
            raise TypeError("RateLimiter needs an engine: RateLimiter(app, engine)")
        app.extensions["ratewarden"] = self
        app.before_request(self._before)
        # The headers go on at the WSGI layer, on the way out: a plain list
        # append, where werkzeug's Headers.add validates each of five fields.
        app.wsgi_app = _AddHeaders(app.wsgi_app)  # type: ignore[method-assign]

    def _before(self) -> Response | None:
        if self.engine is None:  # init_app refuses that
            return None
        outcome, release = _outcome(self.engine, self.identify, self.identify_failures, request)
        if release is not None:  # released when the server closes the response
            request.environ[_SLOTS] = release
        if outcome is None or outcome.allowed:
            _tell_degrade(outcome)
            extra = [] if outcome is None else self.responder.passed(outcome)
            if extra:
                request.environ[_KEY] = extra
            return None
        return _response(self.responder.refused(outcome))


class _AddHeaders:
    """Adds the headers `RateLimiter` left in the environ to the response."""

    def __init__(self, app: WSGIApplication) -> None:
        self.app = app

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            extra = environ.get(_KEY)
            # a view's own @limit already said how it stands: its route's limits
            # speak, and each field appears once
            if extra and not environ.get(ROUTE_SPOKE):
                headers = [*headers, *extra]
            return start_response(status, headers, exc_info)

        try:
            body = self.app(environ, start)
        except BaseException:  # an exception Flask propagates (testing, debug)
            release = environ.pop(_SLOTS, None)
            if release is not None:
                release()
            raise
        release = environ.pop(_SLOTS, None)
        return body if release is None else Releasing(body, release)


def limit(
    engine: RuleEngine,
    *,
    identify: IdentifyRequest | None = None,
    headers: HeaderMode = "all",
    legacy: bool = True,
    ietf: bool = True,
) -> Callable[[Callable[P, Any]], Callable[P, Any]]:
    """A view decorator: the view's own limits from ``engine``, checked when the
    view is called (after the extension's, if both apply)."""
    check_engine(engine, RuleEngine, "limit")
    responder = Responder(headers, legacy=legacy, ietf=ietf)
    failures = IdentifyFailures()

    def decorate(view: Callable[P, Any]) -> Callable[P, Any]:
        @functools.wraps(view)
        def limited(*args: P.args, **kwargs: P.kwargs) -> Any:
            outcome, release = _outcome(engine, identify, failures, request)
            _tell_degrade(outcome)
            if outcome is not None and not outcome.allowed:
                request.environ[ROUTE_SPOKE] = True
                return _response(responder.refused(outcome))
            extra = [] if outcome is None else responder.passed(outcome)
            if not extra and release is None:
                return view(*args, **kwargs)
            try:
                response = make_response(view(*args, **kwargs))
            except BaseException:
                if release is not None:
                    release()
                raise
            if release is not None:  # held until the server closes the response
                response.call_on_close(release)
            for name, value in extra:
                response.headers.add(name, value)
            if extra:
                request.environ[ROUTE_SPOKE] = True  # the extension adds none of its own
            return response

        return limited

    return decorate
