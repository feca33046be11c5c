"""Rate limiting for any WSGI application (Flask, Django, Pyramid, Bottle, ...).

    from .. import MemoryStore
    from .wsgi import RateLimitMiddleware
    from ..rules import RuleEngine

    app = RateLimitMiddleware(app, RuleEngine("rules.yaml", MemoryStore()))
    app = RateLimitMiddleware(app, Limiter("100/minute"))    # per client address

WSGI serves a request on a thread of its own, so the engine is the sync
`RuleEngine` and a ``delay`` holds that thread (on the store's clock). No
framework is imported: this module needs no extra, and with a plain `Limiter`
not even the rule engine's (PyYAML).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from ..kernel import Limiter, Policy
from ._request import (
    DEGRADE_ENVIRON,
    HeaderMode,
    IdentifyFailures,
    LimitOutcome,
    Reply,
    Responder,
    Settled,
    attributes,
    check_engine,
    content_length,
    identity_of,
    limit_policy,
    rule_engines,
    status_of,
)
from ._slots import admit, give_back, holds_slots

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

    from ..rules import Outcome, RuleEngine
else:
    StartResponse = WSGIApplication = WSGIEnvironment = Any

__all__ = [
    "EnvironHeaders",
    "RateLimitMiddleware",
    "environ_attributes",
    "environ_headers",
    "status_line",
]

log = logging.getLogger("ratewarden.integrations")
IdentifyEnviron = Callable[["WSGIEnvironment"], "Mapping[str, object] | None"]
_UNPREFIXED = {"CONTENT_TYPE": "content-type", "CONTENT_LENGTH": "content-length"}


def environ_headers(environ: WSGIEnvironment) -> dict[str, str]:
    """The request headers by lower-case name (``HTTP_X_FORWARDED_FOR`` ->
    ``x-forwarded-for``)."""
    headers: dict[str, str] = {}
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            headers[key[5:].lower().replace("_", "-")] = value
        elif key in _UNPREFIXED and value:
            headers[_UNPREFIXED[key]] = value
    return headers


class EnvironHeaders(Mapping[str, str]):
    """The request headers as a view over the environ: a lookup reads one key
    (``x-forwarded-for`` -> ``HTTP_X_FORWARDED_FOR``) and nothing is copied, since
    most rule sets never read a header."""

    __slots__ = ("_environ",)

    def __init__(self, environ: WSGIEnvironment) -> None:
        self._environ = environ

    def __getitem__(self, name: str) -> str:
        key = _ENVIRON_KEYS.get(name) or "HTTP_" + name.upper().replace("-", "_")
        value = self._environ.get(key)
        if value is None or (key in _UNPREFIXED and not value):
            raise KeyError(name)
        return str(value)

    def __iter__(self) -> Iterator[str]:
        return iter(environ_headers(self._environ))

    def __len__(self) -> int:
        return len(environ_headers(self._environ))


_ENVIRON_KEYS = {v: k for k, v in _UNPREFIXED.items()}


def environ_attributes(
    environ: WSGIEnvironment,
    identity: Mapping[str, object] | None,
    route: str | None = None,
) -> dict[str, object]:
    """The rule attributes of a WSGI request (see `_request.attributes`)."""
    # PEP 3333 hands the path over as latin-1 text of the raw bytes
    raw = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
    path = raw if raw.isascii() else raw.encode("latin-1").decode("utf-8", "replace")
    return attributes(
        environ.get("REQUEST_METHOD", "GET"),
        path or "/",
        environ.get("REMOTE_ADDR"),
        EnvironHeaders(environ),
        body_size=content_length(environ.get("CONTENT_LENGTH")),
        identity=identity,
        route=route,
    )


def status_line(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Unknown"


def check(
    engine: RuleEngine, attributes: Mapping[str, object], identified: bool = True
) -> Outcome | None:
    """The engine's outcome, delays waited out (not ``identified``: its
    ``unidentified``'s); None when the limiter failed (logged): the request goes
    through."""
    try:
        if not identified:
            return engine.unidentified(attributes, wait=True)
        return engine.check(attributes, wait=True)
    except Exception:
        log.exception("rate limiter failed; the request goes through unchecked")
        return None


def check_limit(
    limiter: Limiter, policy: Policy, attributes: Mapping[str, object], identified: bool = True
) -> LimitOutcome | None:
    """`check` for a plain limiter: its hit for the client address, which needs
    no identity (``identified`` changes nothing)."""
    try:
        return LimitOutcome(limiter.hit(str(attributes.get("ip"))), policy)
    except Exception:
        log.exception("rate limiter failed; the request goes through unchecked")
        return None


def admitted(
    engine: RuleEngine, attributes: Mapping[str, object], identified: bool
) -> tuple[Outcome | None, str | None]:
    """`check` with the slots of the concurrency rules: the outcome and the token
    of the slots an allowed request holds; (None, None) when the limiter failed."""
    try:
        admission = admit(engine, attributes, identified)
    except Exception:
        log.exception("rate limiter failed; the request goes through unchecked")
        return None, None
    return admission.outcome, admission.token


def holding(
    app: WSGIApplication,
    engine: RuleEngine,
    slots: str,
    environ: WSGIEnvironment,
    start_response: StartResponse,
) -> Iterable[bytes]:
    """``app``'s response, holding the request's ``slots`` until the server closes
    it (PEP 3333 has every server close what the app returned, however the
    response ended), or until the app raises."""
    try:
        body = app(environ, start_response)
    except BaseException:
        give_back(engine, slots)
        raise
    return Releasing(body, partial(give_back, engine, slots))


class Releasing:
    """A response body that releases its request's slots when it is closed (once)."""

    __slots__ = ("body", "release")

    def __init__(self, body: Iterable[bytes], release: Callable[[], None]) -> None:
        self.body: Iterable[bytes] = body
        self.release: Callable[[], None] | None = release

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.body)

    def close(self) -> None:
        release, self.release = self.release, None
        try:
            close = getattr(self.body, "close", None)
            if close is not None:
                close()
        finally:
            if release is not None:
                release()


def reply_headers(reply: Reply) -> list[tuple[str, str]]:
    return [*reply.headers, ("Content-Length", str(len(reply.body)))]


class RateLimitMiddleware:
    """Checks every request against ``engine`` (a `RuleEngine`, or a plain
    `Limiter`: one limit per client address, 429 when over it, no PyYAML needed)
    before ``app`` sees it. ``identify(environ)`` returns the attributes only the application
    knows (user, api_key, plan, org, ...); ``headers``, ``legacy`` and ``ietf``
    and the handling of each action are as for the ASGI middleware
    (`ratewarden.integrations.asgi.RateLimitMiddleware`), and so is an
    ``identify`` that raises; how much to degrade a response is
    ``environ["ratewarden.degrade"]`` (0.0 to 1.0). A rule that counts by
    response (``count``) is settled with the status the app starts its response
    with, before that response goes out. A rule file's concurrency rules hold
    their slots (the engine's ``acquire``) until the server closes the
    response: its body sent, or the client gone."""

    def __init__(
        self,
        app: WSGIApplication,
        engine: RuleEngine | Limiter,
        *,
        identify: IdentifyEnviron | None = None,
        headers: HeaderMode = "all",
        legacy: bool = True,
        ietf: bool = True,
    ) -> None:
        self.app = app
        self.engine = engine
        # a plain limiter or a rule engine, told apart once here rather than per request
        self._decide: Callable[[Mapping[str, object], bool], Outcome | LimitOutcome | None]
        self._engine: RuleEngine | None = None  # a rule engine's, for its settles
        if isinstance(engine, Limiter):
            self._decide = partial(check_limit, engine, limit_policy(engine))
        else:
            where = "RateLimitMiddleware (WSGI)"
            checked = check_engine(engine, rule_engines(engine, where)[0], where)
            self._decide = partial(check, checked)
            self._engine = checked
        self.identify = identify
        self.identify_failures = IdentifyFailures()
        self.responder = Responder(headers, legacy=legacy, ietf=ietf)

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        identity, identified = identity_of(self.identify, environ, self.identify_failures)
        found = environ_attributes(environ, identity)
        engine = self._engine
        if engine is not None and holds_slots(engine):
            outcome, slots = admitted(engine, found, identified)
            if slots is not None:
                return holding(partial(self._answer, outcome), engine, slots, environ,
                               start_response)  # fmt: skip
            return self._answer(outcome, environ, start_response)
        return self._answer(self._decide(found, identified), environ, start_response)

    def _answer(
        self,
        outcome: Outcome | LimitOutcome | None,
        environ: WSGIEnvironment,
        start_response: StartResponse,
    ) -> Iterable[bytes]:
        """Run the app for an allowed request (``outcome`` None: the limiter
        failed), or answer in its place."""
        if outcome is None or outcome.allowed:
            if outcome is not None:
                environ[DEGRADE_ENVIRON] = outcome.degrade
            extra = [] if outcome is None else self.responder.passed(outcome)
            token = getattr(outcome, "settle", None)
            if token is not None and self._engine is not None:
                return self._settled(self._engine, token, extra, environ, start_response)
            if not extra:
                return self.app(environ, start_response)

            def start_with_headers(
                status: str, headers: list[tuple[str, str]], exc_info: Any = None
            ) -> Any:
                return start_response(status, [*headers, *extra], exc_info)

            return self.app(environ, start_with_headers)
        reply = self.responder.refused(outcome)
        start_response(status_line(reply.status), reply_headers(reply))
        return [reply.body]

    def _settled(
        self,
        engine: RuleEngine,
        token: str,
        extra: list[tuple[str, str]],
        environ: WSGIEnvironment,
        start_response: StartResponse,
    ) -> Iterable[bytes]:
        """Run the app and settle the request's hits (``token``, see
        `ratewarden.rules._settle`) by its status, as soon as the app starts its
        response and before the response goes out, so that a client reading it
        finds its count settled; an app that raises first settles as a 500."""
        settled = Settled(engine.settle, token)

        def start_settling(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Any:
            settled(status_of(status))
            return start_response(status, [*headers, *extra], exc_info)

        try:
            return self.app(environ, start_settling)
        except BaseException:
            settled(500)
            raise

    def __repr__(self) -> str:
        return f"<RateLimitMiddleware {self.engine!r} headers={self.responder.mode!r}>"
