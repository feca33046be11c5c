"""The HTTP API as a plain ASGI app (no framework: a dict of routes and msgspec).

A raw app, not Starlette: a Starlette route for ``/v1/check`` serves about a
third fewer checks per second than this under the same uvicorn
(bench/RESULTS.md, "The service"), and the API is a handful of fixed routes
that need none of a framework's routing, middleware or request objects.

Routes (``openapi()`` documents the same, from the same msgspec types):

    POST   /v1/check          one check -> CheckResult
    POST   /v1/check/batch    up to 1000 checks -> {"results": [...]}
    POST   /v1/acquire        a check that takes the concurrency rules' slots -> lease_id
    POST   /v1/renew          push an acquire's slots on by their rules' lease
    POST   /v1/release        give an acquire's slots back
    POST   /v1/settle         what a checked request counts, told after it ran (the token:
                              a check's "settle", /auth's X-Ratewarden-Settle)
    GET    /v1/rules          the rules in force
    GET    /v1/quotas         the fleet quotas in the Redis store, summed up
    GET    /v1/quotas/{name}  one fleet quota and its members
    GET    /v1/overrides      runtime overrides in force, and their audit trail
    PUT    /v1/overrides/{rule}  replace a rule's rates for a while (admin)
    DELETE /v1/overrides/{rule}  end an override now (admin)
    PUT    /v1/load/{signal}  feed a load signal of the adaptive rules (admin)
    POST   /v1/reload         load the rule file again (admin)
    DELETE /v1/keys/{key}     forget a key, in every limit or one rule's (admin)
    ANY    /auth              for gateways: 200, or 429 + Retry-After + X-RateLimit-*
    GET    /healthz /readyz   alive / the store answers
    GET    /metrics           Prometheus
    GET    /openapi.json      this API
    GET    /                  the live dashboard's page (public: it holds no data)
    GET    /v1/events         the dashboard's Server-Sent Events stream

Bad input is a 4xx with ``{"error": ...}``; the body size is limited. A body
is strict JSON: UTF-8, and no name twice in one object (a proxy or a firewall
in front that reads the first of two names, where a decoder here would read
the last, would judge a different request than the one counted).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import msgspec

from ..primitives import ConfigurationError, StoreError
from . import _admin_api as admin
from ._check_json import check_of, check_result, outcome_result
from ._checker import AttributesCheck
from ._dashboard import Dashboard
from ._http_input import (
    AUTH_METHODS,
    HTTPError,
    auth_attributes,
    least_members,
    parse,
    refuse_duplicates,
    tail,
)
from ._lease_api import LeaseError
from ._lease_api import acquire as acquire_slots
from ._lease_api import release as release_slots
from ._lease_api import renew as renew_slots
from ._metrics import CONTENT_TYPE_LATEST
from ._openapi import openapi
from ._quotas import MAX_LISTED, summary
from ._readiness import store_problem
from ._refusals import InvalidRequest
from ._service import Service
from ._settle_api import SettleError
from ._settle_api import settle as settle_hits
from ._shapes import BatchRequest, BatchResult, CheckRequest, CheckResult, Problem, bearer_matches

if TYPE_CHECKING:
    from ._local_quotas import LocalQuotas
    from ._quota_reader import QuotaReader

__all__ = ["AUTH_METHODS", "App", "auth_attributes", "openapi"]

log = logging.getLogger("ratewarden.server")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

_JSON = [(b"content-type", b"application/json")]
_encode = msgspec.json.Encoder().encode
_decode_check = msgspec.json.Decoder(CheckRequest).decode
_decode_batch = msgspec.json.Decoder(BatchRequest).decode


class App:
    """The ASGI app of a `Service`. ``token``: the bearer token every endpoint
    but health needs (``open_checks``: the check endpoints, rules, metrics and
    the OpenAPI document need none, the admin ones still do)."""

    def __init__(
        self,
        service: Service,
        *,
        token: str | None = None,
        open_checks: bool = False,
        max_body: int = 64 * 1024,
    ) -> None:
        if token is not None and not token:
            raise ConfigurationError("the bearer token must not be empty")
        if type(max_body) is not int or max_body < 1024:
            raise ConfigurationError(f"max_body must be >= 1024 bytes, got {max_body!r}")
        self.service = service  # for its owner: the routes use only the parts below
        # the check routes take the checker, the admin routes the rules in force
        self._decide = service.checker.decide
        self._check_attributes = service.checker.check_attributes
        self._rules_in_force = service.rules
        self._engine = service.rules.engine
        self._counters = service.counters  # acquire counts its checks as /v1/check does
        self._prometheus = service.metrics
        self._store_health = service.health
        self._quota_source = service.quota_source
        self._token = None if token is None else token.encode()
        self.open_checks = open_checks
        self.max_body = max_body
        self._openapi = json.dumps(
            openapi(secured=token is not None, open_checks=open_checks)
        ).encode()
        self._observe = service.metrics.observe
        self.dashboard = Dashboard(
            service.dashboard, service.rules, service.health, service.quota_source
        )
        # (method, path) -> (handler, endpoint name for metrics, who may call it)
        self._routes: dict[tuple[str, str], tuple[_Handler, str, str]] = {
            ("POST", "/v1/check"): (self._check, "check", "check"),
            ("POST", "/v1/check/batch"): (self._batch, "batch", "check"),
            ("POST", "/v1/acquire"): (self._acquire, "acquire", "check"),
            ("POST", "/v1/renew"): (self._renew, "renew", "check"),
            ("POST", "/v1/release"): (self._release, "release", "check"),
            ("POST", "/v1/settle"): (self._settle, "settle", "check"),
            ("GET", "/v1/rules"): (self._rules, "rules", "check"),
            ("GET", "/v1/quotas"): (self._quotas, "quotas", "check"),
            ("POST", "/v1/reload"): (self._reload, "reload", "admin"),
            ("GET", "/healthz"): (self._health, "healthz", "public"),
            ("GET", "/readyz"): (self._ready, "readyz", "public"),
            ("GET", "/metrics"): (self._metrics, "metrics", "check"),
            ("GET", "/openapi.json"): (self._openapi_doc, "openapi", "check"),
            **{("GET", path): (self._asset, "dashboard", "public") for path in Dashboard.ASSETS},
            # admin: the audit trail names people and their addresses
            ("GET", "/v1/overrides"): (self._overrides, "overrides", "admin"),
        }
        # paths under a prefix: (prefix, method, handler, endpoint name, who)
        self._prefixed: tuple[tuple[str, str, _Handler, str, str], ...] = (
            ("/v1/keys/", "DELETE", self._reset, "keys", "admin"),
            ("/v1/quotas/", "GET", self._quota, "quota", "check"),
            ("/v1/overrides/", "PUT", self._set_override, "override", "admin"),
            ("/v1/overrides/", "DELETE", self._clear_override, "override", "admin"),
            ("/v1/load/", "PUT", self._set_load, "load", "admin"),
        )
        self._paths = {path for _, path in self._routes} | {"/auth", "/v1/events"}
        self._allowed = {path: _allow(m for m, p in self._routes if p == path)
                         for path in self._paths}  # fmt: skip
        self._allowed["/v1/events"] = "GET, HEAD"  # a stream, answered outside the routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await _lifespan(receive, send)
        # websockets: not ours; the server closes them

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        method: str = scope["method"]
        path: str = scope["path"]
        endpoint = "other"
        # HEAD is answered as GET would be, without the body (/auth has its own HEAD)
        head = method == "HEAD" and path != "/auth"
        if head:
            method = "GET"
        try:
            if path == "/auth":
                endpoint = "auth"
                if method not in AUTH_METHODS:
                    raise HTTPError(405, f"{method} is not allowed on /auth",
                                     [(b"allow", ", ".join(AUTH_METHODS).encode())])  # fmt: skip
                self._authorize(scope, "check")
                status, headers, body = await self._auth(scope, receive)
            elif path == "/v1/events" and method == "GET":
                endpoint = "events"
                # the token even with open checks: it carries the keys clients are limited by
                self._authorize(scope, "admin")
                if head:  # what the stream would start with, and no stream
                    status, headers, body = 200, self.dashboard.STREAM_HEADERS, b""
                else:
                    await self.dashboard.stream(scope, receive, send)  # HTTPError before it starts
                    return  # a stream's length is no latency
            else:
                route = self._routes.get((method, path))
                if route is None:
                    route = self._prefixed_route(method, path)
                handler, endpoint, who = route
                self._authorize(scope, who)
                status, headers, body = await handler(scope, receive)
        except HTTPError as exc:
            status, headers, body = exc.status, _JSON + exc.headers, _encode(Problem(exc.message))
        except InvalidRequest as exc:
            status, headers, body = exc.status, _JSON, _encode(Problem(str(exc)))
        except StoreError as exc:  # a limit whose failure policy is "raise"
            self._prometheus.tally.store_errors += 1
            status, headers, body = 503, _JSON, _encode(Problem(f"store unavailable: {exc}"))
        # with a length, the server sends the body as it is (with the head) instead of chunking it
        headers = [*headers, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if head else body})
        self._observe(endpoint, time.perf_counter() - started)

    def _prefixed_route(self, method: str, path: str) -> tuple[_Handler, str, str]:
        allowed: list[str] = []
        for prefix, verb, handler, endpoint, who in self._prefixed:
            if path.startswith(prefix):
                if method == verb:
                    return handler, endpoint, who
                allowed.append(verb)
        if allowed:
            raise HTTPError(405, f"{method} is not allowed on {path}",
                            [(b"allow", _allow(allowed).encode())])  # fmt: skip
        allow = self._allowed.get(path)
        if allow is not None:
            raise HTTPError(405, f"{method} is not allowed on {path}",
                             [(b"allow", allow.encode())])  # fmt: skip
        raise HTTPError(404, f"no such endpoint: {path}")

    def _authorize(self, scope: Scope, who: str) -> None:
        if self._token is None:
            if who == "admin" and not _loopback_host(scope["headers"]):
                raise HTTPError(403, NO_TOKEN_ADMIN)
            return
        if who == "public" or (who == "check" and self.open_checks):
            return
        for name, value in scope["headers"]:
            if name == b"authorization":
                if bearer_matches(value, self._token):
                    return
                break
        raise HTTPError(
            401,
            "a valid bearer token is needed",
            [(b"www-authenticate", b'Bearer realm="ratewarden"')],
        )

    async def _body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.max_body
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                raise HTTPError(413, f"the body is larger than {limit} bytes")
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise HTTPError(400, "the client went away")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise HTTPError(413, f"the body is larger than {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    # -- handlers: each returns (status, headers, body) -------------------------

    async def _check(self, scope: Scope, receive: Receive) -> _Answer:
        body = await self._body(scope, receive)
        request: CheckRequest = parse(_decode_check, body)
        if body.count(b":") != least_members(request):  # what _refuse_duplicates tries first
            refuse_duplicates(body, (request,), 0)
        check = check_of(request)
        if type(check) is AttributesCheck:  # the usual case: the rules' outcome, as it is
            outcome = await self._check_attributes(check.attributes, check.cost)
            return 200, _JSON, _encode(outcome_result(outcome))
        return 200, _JSON, _encode(check_result(await self._decide(check)))

    async def _batch(self, scope: Scope, receive: Receive) -> _Answer:
        body = await self._body(scope, receive)
        batch: BatchRequest = parse(_decode_batch, body)
        refuse_duplicates(body, batch.checks, 1)
        checks = []
        for n, request in enumerate(batch.checks):  # all valid, or nothing counts
            try:
                checks.append(check_of(request))
            except InvalidRequest as exc:
                raise type(exc)(f"checks[{n}]: {exc}") from None
        results: list[CheckResult] = []
        for check in checks:  # in order: a batch counts as its checks would
            try:
                results.append(check_result(await self._decide(check)))
            except InvalidRequest as exc:
                error = type(exc)(f"checks[{len(results)}]: {exc}")
                raise error from None
        return 200, _JSON, _encode(BatchResult(results))

    async def _acquire(self, scope: Scope, receive: Receive) -> _Answer:
        body = await self._body(scope, receive)
        status, fields, answer = await acquire_slots(self._engine, self._counters, body)
        headers = [(k.lower().encode(), v.encode()) for k, v in fields.items()]
        return status, _JSON + headers, answer

    async def _release(self, scope: Scope, receive: Receive) -> _Answer:
        body = await self._body(scope, receive)
        try:
            return 200, _JSON, await release_slots(self._engine, body)
        except LeaseError as exc:
            return exc.status, _JSON, _encode(Problem(str(exc)))

    async def _renew(self, scope: Scope, receive: Receive) -> _Answer:
        body = await self._body(scope, receive)
        try:
            return 200, _JSON, await renew_slots(self._engine, body)
        except LeaseError as exc:
            return exc.status, _JSON, _encode(Problem(str(exc)))

    async def _settle(self, scope: Scope, receive: Receive) -> _Answer:
        body = await self._body(scope, receive)
        try:
            return 200, _JSON, await settle_hits(self._engine, body)
        except SettleError as exc:
            return exc.status, _JSON, _encode(Problem(str(exc)))

    async def _rules(self, scope: Scope, receive: Receive) -> _Answer:
        return 200, _JSON, _encode(self._rules_in_force.describe())

    async def _reload(self, scope: Scope, receive: Receive) -> _Answer:
        try:
            answer = await self._rules_in_force.reload()
        except ConfigurationError as exc:
            message = f"not reloaded, the rules in force stay: {exc}"
            return 422, _JSON, _encode(Problem(message))
        return 200, _JSON, _encode(answer)

    async def _reset(self, scope: Scope, receive: Receive) -> _Answer:
        try:
            key = tail(scope, b"/v1/keys/")
            query = parse_qs(scope.get("query_string", b"").decode(), errors="strict")
        except UnicodeDecodeError:
            raise HTTPError(400, "the key and the rule must be UTF-8 once %-decoded") from None
        if not key:
            raise HTTPError(400, "no key given: DELETE /v1/keys/{key}")
        rule = query.get("rule", [None])[-1]
        count = await self._rules_in_force.reset(key, rule)
        return 200, _JSON, _encode({"key": key, "limits_reset": count})

    def _quota_reader(self) -> QuotaReader | LocalQuotas:
        reader = self._quota_source()
        if reader is None:
            raise HTTPError(404, "no fleet quotas: they live in Redis, and this service's "
                             "store is memory (ratewarden serve --store redis://...)")  # fmt: skip
        return reader

    async def _quotas(self, scope: Scope, receive: Receive) -> _Answer:
        reader = self._quota_reader()
        try:
            statuses, truncated = await reader.read(MAX_LISTED)
        except StoreError as exc:
            raise HTTPError(503, f"store unavailable: {exc}") from None
        listed = {"quotas": [summary(status) for status in statuses], "truncated": truncated}
        return 200, _JSON, _encode(listed)

    async def _quota(self, scope: Scope, receive: Receive) -> _Answer:
        reader = self._quota_reader()
        try:
            name = tail(scope, b"/v1/quotas/")
        except UnicodeDecodeError:
            raise HTTPError(400, "a quota name must be UTF-8 once %-decoded") from None
        try:
            status = await reader.show(name)
        except ConfigurationError as exc:
            raise HTTPError(400, str(exc)) from None
        except StoreError as exc:
            raise HTTPError(503, f"store unavailable: {exc}") from None
        if status is None:
            raise HTTPError(404, f"no fleet quota named {name!r}")
        return 200, _JSON, _encode(status.as_dict())

    async def _overrides(self, scope: Scope, receive: Receive) -> _Answer:
        return 200, _JSON, await admin.list_overrides(self._engine)

    async def _set_override(self, scope: Scope, receive: Receive) -> _Answer:
        body = await self._body(scope, receive)
        return 200, _JSON, await admin.set_override(self._engine, scope, body)

    async def _clear_override(self, scope: Scope, receive: Receive) -> _Answer:
        return 200, _JSON, await admin.clear_override(self._engine, scope)

    async def _set_load(self, scope: Scope, receive: Receive) -> _Answer:
        body = await self._body(scope, receive)
        return 200, _JSON, await admin.set_load(self._engine, scope, body)

    async def _health(self, scope: Scope, receive: Receive) -> _Answer:
        if self._store_health.draining:
            return 503, _JSON, _encode({"status": "draining"})
        return 200, _JSON, b'{"status":"ok"}'

    async def _ready(self, scope: Scope, receive: Receive) -> _Answer:
        health = self._store_health
        if health.draining:
            return 503, _JSON, _encode({"status": "draining"})
        problem = await store_problem(health.store)
        if problem is not None:
            said = {"status": "store unreachable", "reason": problem, "store": health.where,
                    "meanwhile": health.policies()}  # fmt: skip
            return 503, _JSON, _encode(said)
        return 200, _JSON, b'{"status":"ready"}'

    async def _metrics(self, scope: Scope, receive: Receive) -> _Answer:
        reader = self._quota_source()
        quotas = () if reader is None else await reader.gauges()
        body = self._prometheus.exposition(quotas)
        return 200, [(b"content-type", CONTENT_TYPE_LATEST.encode())], body

    async def _asset(self, scope: Scope, receive: Receive) -> _Answer:
        return self.dashboard.asset(scope["path"])

    async def _openapi_doc(self, scope: Scope, receive: Receive) -> _Answer:
        return 200, _JSON, self._openapi

    async def _auth(self, scope: Scope, receive: Receive) -> _Answer:
        client = scope.get("client")
        attributes = auth_attributes(scope["headers"], None if client is None else client[0])
        # a gateway holds the request while a delay rule waits; it cannot wait itself
        outcome = (await self._decide(AttributesCheck(attributes), wait=True)).outcome
        headers = [(k.lower().encode(), v.encode()) for k, v in outcome.headers()]
        if outcome.allowed:
            if outcome.settle is not None:  # for the gateway to pass to the backend, which settles
                headers.append((b"x-ratewarden-settle", outcome.settle.encode()))
            return 200, headers, b""
        if outcome.action == "shadow_ban" and outcome.response is not None:
            # A gateway passes any 2xx from here on to the backend: the rule's
            # "success" would have the request processed. Answer 429 with the
            # rule's body and headers, and no rate-limit headers to give it away.
            response = outcome.response
            canned = [(k.lower().encode(), v.encode()) for k, v in response.headers.items()]
            return 429, canned, response.body.encode()
        problem = _encode(Problem(f"rate limited by {_rule_name(outcome)}"))
        return outcome.status, _JSON + headers, problem


# Without a token anything that reaches the port may call the admin endpoints:
# local processes, and a web page in a browser on this machine too, through DNS
# rebinding (its name resolved to 127.0.0.1: the request carries its Host).
NO_TOKEN_ADMIN = (
    "without a token (--token-file) the admin endpoints answer only requests for a "
    "loopback name (127.0.0.1, localhost, [::1]); give the service a token to reach "
    "them by another name"
)
_LOOPBACK_NAMES = (b"127.0.0.1", b"localhost", b"[::1]")


def _loopback_host(headers: Headers) -> bool:
    for name, value in headers:
        if name == b"host":
            host = value.lower()
            if host.startswith(b"["):  # [::1]:8080
                host = host.partition(b"]")[0] + b"]"
            else:
                host = host.partition(b":")[0]
            return host in _LOOPBACK_NAMES
    return False


def _allow(methods: Iterable[str]) -> str:
    """An Allow header's methods: HEAD wherever GET is."""
    allowed = set(methods)
    if "GET" in allowed:
        allowed.add("HEAD")
    return ", ".join(sorted(allowed))


_Answer = tuple[int, Headers, bytes]
_Handler = Callable[[Scope, Receive], Awaitable[_Answer]]


def _rule_name(outcome: Any) -> str:
    return outcome.rule.name if outcome.rule is not None else "a limit"


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
