"""What every framework integration shares, written once: no framework, no I/O.

A front end turns its request into rule attributes with `attributes`, lets the
rule engine decide, and turns the `Outcome` into what to answer with
`Responder`: headers for a response that goes ahead, or a whole `Reply` for one
that does not (a rejection's problem body, a shadow ban's pretended success).

The client address is the peer's (``ip``); the rule file's ``client_ip``
settings (trusted proxies, X-Forwarded-For or Forwarded) find the real client
behind proxies, so the proxy logic lives in one place, the rule engine.

An ``identify`` that raises (or returns something other than a mapping) is
logged by `IdentifyFailures`, within bounds, and the request is decided without
its identity: the engine's ``unidentified`` lets each rule that needs it answer
as its ``on_failure`` says; a plain limiter counts the client address as always.

The rule engine needs PyYAML (the ``rules`` extra) and is imported only where an
engine is used: the ASGI and WSGI middleware also take a plain `Limiter`, one limit
per client address (`LimitOutcome`), and then run on the core alone.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeVar

import msgspec

from ..kernel import AsyncLimiter, Limiter, Policy, rate_limit_headers
from ..primitives import ConfigurationError, Decision

if TYPE_CHECKING:
    from ..rules import AsyncRuleEngine, Outcome, RuleEngine

__all__ = [
    "DEGRADE",
    "DEGRADE_ENVIRON",
    "PROBLEM_TYPE",
    "ROUTE_SPOKE",
    "HeaderMode",
    "IdentifyFailures",
    "Identity",
    "LimitOutcome",
    "Reply",
    "Responder",
    "Settled",
    "attributes",
    "check_any_engine",
    "check_engine",
    "content_length",
    "identity_of",
    "limit_policy",
    "mapping_or_none",
    "rule_engines",
    "status_of",
]

# Set (in the WSGI environ or the ASGI scope) by a per-route check that already put
# its rate-limit headers on the response, or refused it: the app-wide middleware
# then adds none of its own, so that each field appears once and the route speaks.
ROUTE_SPOKE = "ratewarden.route_headers"

# Where a front end leaves how much to degrade the response (0: not at all, to 1):
# the key of ASGI's ``scope["state"]`` (Starlette's ``request.state.ratewarden_degrade``),
# of the WSGI environ (``"ratewarden.degrade"``), the attribute of Django's request.
DEGRADE = "ratewarden_degrade"
DEGRADE_ENVIRON = "ratewarden.degrade"

E = TypeVar("E", "RuleEngine", "AsyncRuleEngine")
T = TypeVar("T")

HeaderMode = Literal["all", "denied", "none"]
_MODES = ("all", "denied", "none")

# The IETF RateLimit draft's problem type for a request over its quota.
PROBLEM_TYPE = "https://iana.org/assignments/http-problem-types#quota-exceeded"
_TITLE = "Request cannot be satisfied as assigned quota has been exceeded"
_PROBLEM_JSON = ("Content-Type", "application/problem+json")


log = logging.getLogger("ratewarden.integrations")

# What ``identify`` hands back: the attributes only the application knows, or None
# for none; `identity_of` tells a failure (False) from an identified request (True).
Identity = tuple["Mapping[str, object] | None", bool]


class IdentifyFailures:
    """Logs the exceptions of an application's ``identify``, within bounds.

    One ERROR line on ``ratewarden.integrations`` per exception type every
    ``every`` seconds: the first of a type carries its traceback, a later one
    says how many of that type came since the line before. At most ``types``
    types are remembered (the longest quiet one is forgotten first), so a flood
    of failures writes at most ``types`` lines every ``every`` seconds and holds
    that many entries. ``clock`` gives seconds (monotonic; tests pass their own).
    """

    __slots__ = ("_clock", "_lock", "_seen", "every", "types")

    def __init__(
        self, *, every: float = 60.0, types: int = 64, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not every > 0:
            raise ConfigurationError(f"every must be > 0 seconds, got {every!r}")
        if type(types) is not int or types < 1:
            raise ConfigurationError(f"types must be an integer >= 1, got {types!r}")
        self.every = every
        self.types = types
        self._clock = clock
        self._lock = threading.Lock()  # WSGI and sync Django call from many threads
        # exception type -> [when its last line was written, failures since]
        self._seen: OrderedDict[type[BaseException], list[float]] = OrderedDict()

    def __len__(self) -> int:
        """The exception types remembered now."""
        return len(self._seen)

    def failed(self, exc: Exception) -> None:
        """``identify`` raised ``exc``: log it, if due."""
        kind = type(exc)
        now = self._clock()
        with self._lock:
            seen = self._seen.get(kind)
            if seen is not None and now - seen[0] < self.every:
                seen[1] += 1
                return
            first = seen is None
            more = 0 if seen is None else int(seen[1])
            self._seen[kind] = [now, 0]
            self._seen.move_to_end(kind)
            while len(self._seen) > self.types:
                self._seen.popitem(last=False)
        name = kind.__qualname__
        if first:
            log.error(
                "identify raised %s: %s; requests are decided without their identity (rules"
                " that need it follow their on_failure) and further %s are logged once every"
                " %gs",
                name, exc, name, self.every, exc_info=exc,
            )  # fmt: skip
        else:
            log.error(
                "identify raised %s again: %s (%d more since the last line); requests are"
                " decided without their identity",
                name, exc, more,
            )  # fmt: skip


def mapping_or_none(identity: object) -> Mapping[str, object] | None:
    """What ``identify`` returned, if it is attributes (a mapping, or None for
    none); anything else is the application's mistake, a `TypeError` saying so."""
    if identity is None or type(identity) is dict or isinstance(identity, Mapping):
        return identity
    raise TypeError(f"identify must return a mapping of attributes or None, got {identity!r}")


def identity_of(
    identify: Callable[[T], object] | None, request: T, failures: IdentifyFailures
) -> Identity:
    """``identify(request)`` as `Identity`: a failure is logged by ``failures``
    and answered ``(None, False)``."""
    if identify is None:
        return None, True
    try:
        return mapping_or_none(identify(request)), True
    except Exception as exc:
        failures.failed(exc)
        return None, False


class Reply(NamedTuple):
    """A response the limiter answers in the application's place."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


def attributes(
    method: str,
    path: str,
    ip: str | None,
    headers: Mapping[str, str],
    *,
    body_size: int | None = None,
    identity: Mapping[str, object] | None = None,
    route: str | None = None,
) -> dict[str, object]:
    """The rule attributes of a request: ``method``, ``path`` (as requested),
    ``ip`` (the peer), ``headers`` (lower-case names; the front ends pass a lazy
    view, since most rule sets never read one), ``body_size`` (Content-Length, for
    ``cost: {attribute: body_size}``), ``route`` (the template the framework
    matched, when it knows it: ``/orders/{id}``), then what ``identity`` says (it
    may override any of these)."""
    found: dict[str, object] = {"method": method, "path": path, "ip": ip, "headers": headers}
    if body_size is not None:
        found["body_size"] = body_size
    if route is not None:
        found["route"] = route
    if identity:
        found.update(identity)
    return found


def content_length(value: str | bytes | None) -> int | None:
    if value is None or not value.isdigit():
        return None
    return int(value)


class LimitOutcome:
    """A plain limiter's Decision, read by `Responder` as it reads the rule engine's
    `Outcome`: allowed, or rejected with 429."""

    __slots__ = ("decision", "policy")

    degrade: float = 0.0
    response: None = None
    rule: None = None

    def __init__(self, decision: Decision, policy: Policy) -> None:
        self.decision = decision
        self.policy = policy

    def __repr__(self) -> str:
        return f"LimitOutcome({self.decision!r}, {self.policy!r})"

    @property
    def allowed(self) -> bool:
        return self.decision.allowed

    @property
    def action(self) -> Literal["allow", "reject"]:
        return "allow" if self.decision.allowed else "reject"

    @property
    def status(self) -> int:
        return 200 if self.decision.allowed else 429

    def headers(self, *, legacy: bool = True, ietf: bool = True) -> list[tuple[str, str]]:
        return rate_limit_headers(self.decision, (self.policy,), legacy=legacy, ietf=ietf)

    def degrade_headers(self) -> list[tuple[str, str]]:
        return []


def limit_policy(limiter: Limiter | AsyncLimiter) -> Policy:
    """How ``RateLimit-Policy`` names a plain limiter's limit."""
    return Policy(limiter.name or "default", limiter.effective_limit, limiter.rate.period)


def rule_engines(engine: object, where: str) -> tuple[type[RuleEngine], type[AsyncRuleEngine]]:
    """The rule engine's classes, imported on first use: the rules extra's PyYAML
    is needed only by an application that uses an engine."""
    try:
        from ..rules import AsyncRuleEngine, RuleEngine  # noqa: PLC0415
    except ImportError as exc:  # then ``engine`` cannot be one
        raise ConfigurationError(
            f"{where} needs a Limiter, or a rule engine (pip install 'ratewarden[rules]'),"
            f" got {type(engine).__name__}"
        ) from exc
    return RuleEngine, AsyncRuleEngine


def check_engine(engine: object, kind: type[E], where: str) -> E:
    """``engine`` if it is a ``kind``, else a `ConfigurationError` saying which to use."""
    if not isinstance(engine, kind):
        store = "AsyncMemoryStore" if kind.__name__.startswith("Async") else "MemoryStore"
        raise ConfigurationError(
            f"{where} needs a {kind.__name__} (on a store such as {store}),"
            f" got {type(engine).__name__}"
        )
    return engine


def check_any_engine(engine: object, where: str) -> RuleEngine | AsyncRuleEngine:
    """``engine`` if it is a rule engine of either kind, else a `ConfigurationError`."""
    sync, asynchronous = rule_engines(engine, where)
    if not isinstance(engine, sync | asynchronous):
        raise ConfigurationError(
            f"{where} needs a RuleEngine or AsyncRuleEngine, got {type(engine).__name__}"
        )
    return engine


def status_of(line: str) -> int:
    """The code of a WSGI status line (``"401 Unauthorized"``); 500 for one that
    has none."""
    code = line.partition(" ")[0]
    return int(code) if code.isdigit() and len(code) == 3 else 500


class Settled:
    """A request's settle (`ratewarden.rules._settle`), made once, by the first
    status told: ``settle(token, status=...)`` is the engine's, called (a sync
    engine's) or awaited (``told``). A settle that fails is logged, and the hits
    stay counted: the response goes out as the app made it."""

    __slots__ = ("done", "settle", "token")

    def __init__(self, settle: Callable[..., Any], token: str) -> None:
        self.settle, self.token, self.done = settle, token, False

    def __call__(self, status: int) -> None:
        if not self.done:
            self.done = True
            try:
                self.settle(self.token, status=status)
            except Exception:
                log.exception("settling the request's hits failed; they stay counted")

    async def told(self, status: int) -> None:
        """``__call__`` for an awaited ``settle``."""
        if not self.done:
            self.done = True
            try:
                await self.settle(self.token, status=status)
            except Exception:
                log.exception("settling the request's hits failed; they stay counted")


class Responder:
    """Turns Outcomes into headers and replies, as configured once.

    ``headers``: ``"all"`` adds the rate-limit headers to every response a limit
    applied to, ``"denied"`` only to rejections, ``"none"`` never (Retry-After
    still goes on a rejection: a 429 without it invites a retry storm).
    ``legacy``: the X-RateLimit-* trio; ``ietf``: RateLimit and RateLimit-Policy.
    """

    __slots__ = ("ietf", "legacy", "mode", "on_pass")

    def __init__(
        self, headers: HeaderMode = "all", *, legacy: bool = True, ietf: bool = True
    ) -> None:
        if headers not in _MODES:
            raise ConfigurationError(f"headers must be one of {', '.join(_MODES)}, got {headers!r}")
        self.mode = headers
        self.legacy = bool(legacy)
        self.ietf = bool(ietf)
        self.on_pass = headers == "all"

    def passed(self, outcome: Outcome | LimitOutcome) -> list[tuple[str, str]]:
        """Headers to add to the application's response for an allowed request:
        the rate-limit headers as configured, and a degrade rule's own header
        (the rule asks for it, whatever ``headers`` says)."""
        if not self.on_pass:
            return outcome.degrade_headers() if outcome.degrade else []
        if outcome.decision is None and not outcome.degrade:
            return []
        return outcome.headers(legacy=self.legacy, ietf=self.ietf)

    def refused(self, outcome: Outcome | LimitOutcome) -> Reply:
        """The answer to a request the limiter stops: the rule's configured success
        response for a shadow ban (no rate-limit headers: the client must not
        learn it is limited), else a problem+json rejection with its status."""
        if outcome.action == "shadow_ban" and outcome.response is not None:
            response = outcome.response
            body = response.body.encode()
            # HTTP header values are latin-1 (ASGI and PEP 3333 both insist);
            # a rule file may hold anything, which must not turn into a 500
            headers = [(_latin1(n), _latin1(v)) for n, v in response.headers.items()]
            if not any(name.lower() == "content-type" for name, _ in headers):
                headers.append(("Content-Type", _guess_type(response.body)))
            return Reply(response.status, headers, body)
        if self.mode == "none":
            headers = [(n, v) for n, v in outcome.headers() if n == "Retry-After"]
        else:
            headers = outcome.headers(legacy=self.legacy, ietf=self.ietf)
        headers.append(_PROBLEM_JSON)
        return Reply(outcome.status, headers, problem(outcome))


def retry_seconds(retry_after: float) -> int:
    """A Retry-After in whole seconds: at least one, rounded up."""
    return max(1, math.ceil(retry_after))


def too_many(wait: int, detail: str) -> Reply:
    """A 429 problem+json answer with Retry-After ``wait`` seconds, for the
    middleware's options that refuse outside a rule (a concurrency slot, a
    reservation's budget)."""
    body = json.dumps(
        {"type": "about:blank", "title": "Too Many Requests", "status": 429, "detail": detail}
    ).encode()
    return Reply(429, [_PROBLEM_JSON, ("Retry-After", str(wait))], body)


def problem(outcome: Outcome | LimitOutcome) -> bytes:
    """The RFC 9457 problem body of a rejection, with the draft's
    ``violated-policies``: the limit that denied (the one whose retry is furthest
    away, so retrying after it passes them all)."""
    decision = outcome.decision
    policies: Iterable[str] = ()
    if decision is None:
        detail = "the request was refused by the rate limiter"
    else:
        policies = [decision.rule or "default"]
        if decision.degraded:
            detail = "the rate limiter cannot count right now and this limit fails closed"
        elif math.isinf(decision.retry_after):
            detail = f"the request costs more than a limit of {decision.limit} ever grants"
        else:
            wait = max(1, math.ceil(decision.retry_after))
            detail = f"over the limit of {decision.limit}; retry in {wait} s"
    body = {
        "type": PROBLEM_TYPE,
        "title": _TITLE,
        "status": outcome.status,
        "detail": detail,
        "violated-policies": list(policies),
    }
    return msgspec.json.encode(body)


def _latin1(text: str) -> str:
    return text if text.isascii() else text.encode("latin-1", "replace").decode("latin-1")


def _guess_type(body: str) -> str:
    """A shadow ban's body is usually the JSON the real endpoint would send."""
    try:
        msgspec.json.decode(body)
    except msgspec.DecodeError:
        return "text/plain; charset=utf-8"
    return "application/json"
