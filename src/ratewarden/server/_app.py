"""The HTTP API as a plain ASGI app (no framework: a dict of routes and msgspec).

A raw app, not Starlette: on this project's VM a Starlette route for
``/v1/check`` served about a third fewer checks per second than this under the
same uvicorn (bench/RESULTS.md, "The service"), and the API is a handful of
fixed routes that need none of a framework's routing, middleware or request
objects.

Routes (``openapi()`` documents the same, from the same msgspec types):

    POST   /v1/check          one check -> CheckResult
    POST   /v1/check/batch    up to 1000 checks -> {"results": [...]}
    GET    /v1/rules          the rules in force
    GET    /v1/quotas         the fleet quotas in the Redis store, summed up
    GET    /v1/quotas/{name}  one fleet quota and its members
    POST   /v1/reload         load the rule file again (admin)
    DELETE /v1/keys/{key}     forget a key, in every limit or one rule's (admin)
    ANY    /auth              for gateways: 200, or 429 + Retry-After + X-RateLimit-*
    GET    /healthz /readyz   alive / the store answers
    GET    /metrics           Prometheus
    GET    /openapi.json      this API

Bad input is a 4xx with ``{"error": ...}``; the body size is limited. A body
is strict JSON: UTF-8, and no name twice in one object (a proxy or a firewall
in front that reads the first of two names, where a decoder here would read
the last, would judge a different request than the one counted).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote_to_bytes

import msgspec

from .._errors import ConfigurationError, StoreError
from ._core import BatchRequest, BatchResult, CheckRequest, CheckResult, Problem, bearer_matches
from ._metrics import CONTENT_TYPE_LATEST
from ._quotas import MAX_LISTED, Quota, QuotaList, summary
from ._service import InvalidRequest, Service

if TYPE_CHECKING:
    from ._quotaread import QuotaReader

__all__ = ["App", "auth_attributes"]

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

# Headers a gateway forwards about the original request, and the attribute each
# becomes (nginx sets the X-Original-* ones in its auth_request location;
# Traefik's forwardAuth sends the X-Forwarded-* ones).
_AUTH_HEADERS = {
    b"x-original-uri": "path",
    b"x-forwarded-uri": "path",
    b"x-original-method": "method",
    b"x-forwarded-method": "method",
    b"x-api-key": "api_key",
    b"x-user": "user",
    b"x-org": "org",
    b"x-plan": "plan",
    b"x-forwarded-host": "host",
}


# The methods a gateway's subrequest may carry (nginx's is the original one's).
AUTH_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE")


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, headers: Headers | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or []


def auth_attributes(headers: Headers, peer: str | None) -> dict[str, object]:
    """The attributes of the request a gateway asks about, from its headers.

    ``ip`` is the peer (the gateway) and every header goes into ``headers``, so
    the rule file's ``client_ip.trusted_proxies`` decides whether X-Forwarded-For
    is believed, as for any other front end.

    Values are UTF-8, as JSON sent to ``/v1/check`` is, so that one name counts
    under one key whichever way it comes. A header that becomes an attribute
    (X-User, X-Api-Key, ...) must be valid UTF-8 and come once: otherwise
    `InvalidRequest`, since there is no telling which value the gateway meant.
    Other headers keep their bytes as Latin-1 when they are not UTF-8, and a
    header sent on several lines is one comma-separated value (RFC 9110 5.3),
    so that X-Forwarded-For holds every hop."""
    attributes: dict[str, object] = {}
    header_map: dict[str, str] = {}
    mapped: set[bytes] = set()
    for raw_name, raw_value in headers:
        name = _AUTH_HEADERS.get(raw_name)
        try:
            value = raw_value.decode()
        except UnicodeDecodeError:
            if name is not None:
                raise InvalidRequest(f"{_title(raw_name)} is not valid UTF-8") from None
            value = raw_value.decode("latin-1")
        if name is not None:
            if raw_name in mapped:
                raise InvalidRequest(f"{_title(raw_name)} is given more than once")
            mapped.add(raw_name)
            if name not in attributes:  # X-Original-URI and X-Forwarded-Uri: the first
                attributes[name] = value
        key = raw_name.decode("latin-1")
        previous = header_map.get(key)
        header_map[key] = value if previous is None else f"{previous}, {value}"
    path = attributes.get("path")
    if isinstance(path, str) and "?" in path:
        attributes["path"] = path.partition("?")[0]
    attributes.setdefault("method", "GET")
    if peer is not None:
        attributes["ip"] = peer
    attributes["headers"] = header_map
    return attributes


def _title(raw_name: bytes) -> str:
    return "-".join(part.capitalize() for part in raw_name.decode("latin-1").split("-"))


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
        self.service = service
        self._token = None if token is None else token.encode()
        self.open_checks = open_checks
        self.max_body = max_body
        self._openapi = json.dumps(
            openapi(secured=token is not None, open_checks=open_checks)
        ).encode()
        observe = service.metrics.observe
        self._observe = observe
        # (method, path) -> (handler, endpoint name for metrics, who may call it)
        self._routes: dict[tuple[str, str], tuple[_Handler, str, str]] = {
            ("POST", "/v1/check"): (self._check, "check", "check"),
            ("POST", "/v1/check/batch"): (self._batch, "batch", "check"),
            ("GET", "/v1/rules"): (self._rules, "rules", "check"),
            ("GET", "/v1/quotas"): (self._quotas, "quotas", "check"),
            ("POST", "/v1/reload"): (self._reload, "reload", "admin"),
            ("GET", "/healthz"): (self._health, "healthz", "public"),
            ("GET", "/readyz"): (self._ready, "readyz", "public"),
            ("GET", "/metrics"): (self._metrics, "metrics", "check"),
            ("GET", "/openapi.json"): (self._openapi_doc, "openapi", "check"),
        }
        # paths under a prefix: (prefix, method, handler, endpoint name, who)
        self._prefixed: tuple[tuple[str, str, _Handler, str, str], ...] = (
            ("/v1/keys/", "DELETE", self._reset, "keys", "admin"),
            ("/v1/quotas/", "GET", self._quota, "quota", "check"),
        )
        self._paths = {path for _, path in self._routes} | {"/auth"}
        self._allowed = {
            path: ", ".join(sorted(m for m, p in self._routes if p == path)) for path in self._paths
        }

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
        try:
            if path == "/auth":
                endpoint = "auth"
                if method not in AUTH_METHODS:
                    raise _HTTPError(405, f"{method} is not allowed on /auth",
                                     [(b"allow", ", ".join(AUTH_METHODS).encode())])  # fmt: skip
                self._authorize(scope, "check")
                status, headers, body = await self._auth(scope, receive)
            else:
                route = self._routes.get((method, path))
                if route is None:
                    route = self._prefixed_route(method, path)
                handler, endpoint, who = route
                self._authorize(scope, who)
                status, headers, body = await handler(scope, receive)
        except _HTTPError as exc:
            status, headers, body = exc.status, _JSON + exc.headers, _encode(Problem(exc.message))
        except InvalidRequest as exc:
            status, headers, body = exc.status, _JSON, _encode(Problem(str(exc)))
        except StoreError as exc:  # a limit whose failure policy is "raise"
            self.service.metrics.store_errors.inc()
            status, headers, body = 503, _JSON, _encode(Problem(f"store unavailable: {exc}"))
        # with a length, uvicorn sends the body as it is instead of chunking it
        headers = [*headers, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        self._observe(endpoint, time.perf_counter() - started)

    def _prefixed_route(self, method: str, path: str) -> tuple[_Handler, str, str]:
        for prefix, allowed, handler, endpoint, who in self._prefixed:
            if path.startswith(prefix):
                if method != allowed:
                    raise _HTTPError(405, f"{method} is not allowed on {path}",
                                     [(b"allow", allowed.encode())])  # fmt: skip
                return handler, endpoint, who
        allow = self._allowed.get(path)
        if allow is not None:
            raise _HTTPError(405, f"{method} is not allowed on {path}",
                             [(b"allow", allow.encode())])  # fmt: skip
        raise _HTTPError(404, f"no such endpoint: {path}")

    def _authorize(self, scope: Scope, who: str) -> None:
        if self._token is None or who == "public" or (who == "check" and self.open_checks):
            return
        for name, value in scope["headers"]:
            if name == b"authorization":
                if bearer_matches(value, self._token):
                    return
                break
        raise _HTTPError(
            401,
            "a valid bearer token is needed",
            [(b"www-authenticate", b'Bearer realm="ratewarden"')],
        )

    async def _body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.max_body
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                raise _HTTPError(413, f"the body is larger than {limit} bytes")
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _HTTPError(400, "the client went away")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _HTTPError(413, f"the body is larger than {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    # -- handlers: each returns (status, headers, body) -------------------------

    async def _check(self, scope: Scope, receive: Receive) -> _Answer:
        body = await self._body(scope, receive)
        request: CheckRequest = _parse(_decode_check, body)
        if body.count(b":") != _least_members(request):  # what _refuse_duplicates tries first
            _refuse_duplicates(body, (request,), 0)
        result = await self.service.check(request)
        return 200, _JSON, _encode(result)

    async def _batch(self, scope: Scope, receive: Receive) -> _Answer:
        body = await self._body(scope, receive)
        batch: BatchRequest = _parse(_decode_batch, body)
        _refuse_duplicates(body, batch.checks, 1)
        for n, request in enumerate(batch.checks):  # all valid, or nothing counts
            try:
                self.service.validate(request)
            except InvalidRequest as exc:
                raise type(exc)(f"checks[{n}]: {exc}") from None
        results: list[CheckResult] = []
        for request in batch.checks:  # in order: a batch counts as its checks would
            try:
                results.append(await self.service.check(request))
            except InvalidRequest as exc:
                error = type(exc)(f"checks[{len(results)}]: {exc}")
                raise error from None
        return 200, _JSON, _encode(BatchResult(results))

    async def _rules(self, scope: Scope, receive: Receive) -> _Answer:
        return 200, _JSON, _encode(self.service.describe())

    async def _reload(self, scope: Scope, receive: Receive) -> _Answer:
        try:
            answer = await self.service.reload()
        except ConfigurationError as exc:
            message = f"not reloaded, the rules in force stay: {exc}"
            return 422, _JSON, _encode(Problem(message))
        return 200, _JSON, _encode(answer)

    async def _reset(self, scope: Scope, receive: Receive) -> _Answer:
        try:
            key = _tail(scope, b"/v1/keys/")
            query = parse_qs(scope.get("query_string", b"").decode(), errors="strict")
        except UnicodeDecodeError:
            raise _HTTPError(400, "the key and the rule must be UTF-8 once %-decoded") from None
        if not key:
            raise _HTTPError(400, "no key given: DELETE /v1/keys/{key}")
        rule = query.get("rule", [None])[-1]
        count = await self.service.reset(key, rule)
        return 200, _JSON, _encode({"key": key, "limits_reset": count})

    def _quota_reader(self) -> QuotaReader:
        reader = self.service.quotas
        if reader is None:
            raise _HTTPError(404, "no fleet quotas: they live in Redis, and this service's "
                             "store is memory (ratewarden serve --store redis://...)")  # fmt: skip
        return reader

    async def _quotas(self, scope: Scope, receive: Receive) -> _Answer:
        reader = self._quota_reader()
        try:
            statuses, truncated = await reader.read(MAX_LISTED)
        except StoreError as exc:
            raise _HTTPError(503, f"store unavailable: {exc}") from None
        listed = {"quotas": [summary(status) for status in statuses], "truncated": truncated}
        return 200, _JSON, _encode(listed)

    async def _quota(self, scope: Scope, receive: Receive) -> _Answer:
        reader = self._quota_reader()
        try:
            name = _tail(scope, b"/v1/quotas/")
        except UnicodeDecodeError:
            raise _HTTPError(400, "a quota name must be UTF-8 once %-decoded") from None
        try:
            status = await reader.show(name)
        except ConfigurationError as exc:
            raise _HTTPError(400, str(exc)) from None
        except StoreError as exc:
            raise _HTTPError(503, f"store unavailable: {exc}") from None
        if status is None:
            raise _HTTPError(404, f"no fleet quota named {name!r}")
        return 200, _JSON, _encode(status.as_dict())

    async def _health(self, scope: Scope, receive: Receive) -> _Answer:
        if self.service.draining:
            return 503, _JSON, _encode({"status": "draining"})
        return 200, _JSON, b'{"status":"ok"}'

    async def _ready(self, scope: Scope, receive: Receive) -> _Answer:
        if self.service.draining:
            return 503, _JSON, _encode({"status": "draining"})
        problem = await self.service.ready()
        if problem is not None:
            return 503, _JSON, _encode({"status": problem})
        return 200, _JSON, b'{"status":"ready"}'

    async def _metrics(self, scope: Scope, receive: Receive) -> _Answer:
        quotas = await self.service.quota_gauges()
        body = self.service.metrics.exposition(quotas)
        return 200, [(b"content-type", CONTENT_TYPE_LATEST.encode())], body

    async def _openapi_doc(self, scope: Scope, receive: Receive) -> _Answer:
        return 200, _JSON, self._openapi

    async def _auth(self, scope: Scope, receive: Receive) -> _Answer:
        client = scope.get("client")
        attributes = auth_attributes(scope["headers"], None if client is None else client[0])
        # a gateway holds the request while a delay rule waits; it cannot wait itself
        outcome = await self.service.check_attributes(attributes, wait=True)
        headers = [(k.lower().encode(), v.encode()) for k, v in outcome.headers()]
        if outcome.allowed:
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


_Answer = tuple[int, Headers, bytes]
_Handler = Callable[[Scope, Receive], Awaitable[_Answer]]


def _tail(scope: Scope, prefix: bytes) -> str:
    """The rest of the path after ``prefix``, %-decoded, as UTF-8 (raw_path:
    scope["path"] is decoded already, and a key may hold %-escapes; a key is
    UTF-8, as the checks that made it were). UnicodeDecodeError if it is not."""
    raw = scope.get("raw_path")
    if raw is None or not raw.startswith(prefix):  # no raw path, or its prefix %-escaped
        path: str = scope["path"]
        return path[len(prefix) :]
    return unquote_to_bytes(raw.partition(b"?")[0][len(prefix) :]).decode()


def _rule_name(outcome: Any) -> str:
    return outcome.rule.name if outcome.rule is not None else "a limit"


def _parse(decode: Callable[[bytes], Any], body: bytes) -> Any:
    if not body:
        raise _HTTPError(400, "the request needs a JSON body")
    try:
        return decode(body)
    except msgspec.ValidationError as exc:
        raise _HTTPError(422, f"invalid request: {_explain(exc, body)}") from None
    except msgspec.DecodeError as exc:
        raise _HTTPError(400, f"malformed JSON: {exc}") from None
    except UnicodeDecodeError as exc:  # msgspec checks UTF-8 and raises this
        raise _HTTPError(400, f"malformed JSON: not UTF-8 ({exc.reason})") from None
    except RecursionError:  # the types stop at a few levels; this is the backstop
        raise _HTTPError(400, "malformed JSON: nested too deeply") from None


# msgspec names a dict's member `[...]`: the attribute is found again for the message
_ATTRIBUTE_AT = re.compile(r"at `\$(?:\.checks\[(\d+)\])?\.attributes\[\.\.\.\]")


def _explain(exc: msgspec.ValidationError, body: bytes) -> str:
    message = str(exc)
    where = _ATTRIBUTE_AT.search(message)
    if where is None:
        return message
    try:  # the error path only: this body is refused whatever happens here
        document = msgspec.json.decode(body)
        check = document if where[1] is None else document["checks"][int(where[1])]
        problem = _attribute_type(check["attributes"])
    except (RecursionError, msgspec.DecodeError, LookupError, TypeError, ValueError):
        return message
    if problem is None:
        return message
    return problem if where[1] is None else f"checks[{where[1]}]: {problem}"


def _attribute_type(attributes: dict[str, Any]) -> str | None:
    for name, value in attributes.items():
        if value is None or type(value) is str:
            continue
        if type(value) is dict and name == "headers":
            for header, text in value.items():
                if type(text) is not str:
                    kind = _json_type(text)
                    return f"attribute 'headers': {header!r} must be a string, got {kind}"
            continue
        return f"attribute {name!r} must be a string (or null), got {_json_type(value)}"
    return None


def _json_type(value: object) -> str:
    kinds = {bool: "a boolean", int: "a number", float: "a number", str: "a string",
             list: "an array", dict: "an object"}  # fmt: skip
    return kinds.get(type(value), "null")


# -- duplicate names ------------------------------------------------------------
#
# msgspec keeps the last of two equal names in an object and says nothing. Each
# name in a JSON text is followed by one colon outside strings, so a text with
# no more colons outside strings than the decoded request has names cannot have
# had a name twice. Counting costs well under a microsecond: all the colons, or
# when some are inside strings and no backslash escapes a quote, all of them
# less those between quotes. Only a body neither count settles (a repeated
# name, an escaped string with a colon, an explicit default such as "cost": 1)
# is scanned again by the standard library's decoder, which reports every
# object's names in order.


def _refuse_duplicates(body: bytes, checks: Sequence[CheckRequest], members: int) -> None:
    colons = body.count(b":")
    least = members
    for check in checks:
        least += _least_members(check)
    if colons == least:
        return
    # with no backslash, no quote is escaped: the split's odd parts are the strings
    if b"\\" not in body and colons - b"".join(body.split(b'"')[1::2]).count(b":") == least:
        return
    try:
        _scan(body.decode())
    except _Duplicate as exc:
        message = f"malformed JSON: the name {exc.args[0]!r} appears twice in one object"
        raise _HTTPError(400, message) from None
    except (ValueError, RecursionError) as exc:  # msgspec took it; should not happen
        raise _HTTPError(400, f"malformed JSON: {exc}") from None


def _least_members(check: CheckRequest) -> int:
    """Names the request's JSON had at least: a field holding its default (cost
    1, domain null) may have been sent or not, and is not counted."""
    count = 0
    attributes = check.attributes
    if attributes is not None:
        headers = attributes.get("headers")
        count = 1 + len(attributes) + (len(headers) if type(headers) is dict else 0)
    if check.domain is not None:
        count += 1
    if check.descriptors is not None:
        count += 1
        for descriptor in check.descriptors:
            count += 1 + 2 * len(descriptor.entries)
    if check.cost != 1:
        count += 1
    return count


class _Duplicate(Exception):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> None:
    if len(pairs) > 1:
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise _Duplicate(name)
            seen.add(name)


_scan = json.JSONDecoder(object_pairs_hook=_pairs).decode


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def openapi(*, secured: bool = False, open_checks: bool = False) -> dict[str, Any]:
    """The OpenAPI 3.1 document, its schemas made by msgspec from the types the
    app decodes and encodes, so that it cannot drift from what the app does;
    ``secured``: a bearer token is required, as `App` requires it."""
    (check_req, batch_req, check_res, batch_res, problem, quota, quota_list), components = (
        msgspec.json.schema_components(
            [CheckRequest, BatchRequest, CheckResult, BatchResult, Problem, Quota, QuotaList],
            ref_template="#/components/schemas/{name}",
        )
    )
    errors = {"content": {"application/json": {"schema": problem}}}
    # what msgspec cannot say: a cost is a whole number (read as a float, so that
    # 3.0 passes as JSON Schema's integer does), and attributes, or a domain
    # with descriptors, not both
    components["CheckRequest"]["properties"]["cost"]["type"] = "integer"
    components["LimitOverride"]["properties"]["requests_per_unit"]["type"] = "integer"
    # and that only "headers" holds an object: the other attributes are strings
    strings = {"type": "object", "additionalProperties": {"type": "string"}}
    components["CheckRequest"]["properties"]["attributes"] = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"headers": {"anyOf": [strings, {"type": "null"}]}},
                "additionalProperties": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            },
            {"type": "null"},
        ],
        "default": None,
        "description": "Strings (a number too: '42'); null is the same as leaving one out;"
        " headers: lower-case names to strings",
    }
    components["CheckRequest"]["oneOf"] = [
        {"required": ["attributes"],
         "properties": {"attributes": {"type": "object"}, "domain": {"type": "null"},
                        "descriptors": {"type": "null"}}},
        {"required": ["domain", "descriptors"],
         "properties": {"attributes": {"type": "null"}, "domain": {"type": "string"},
                        "descriptors": {"type": "array"}}},
    ]  # fmt: skip

    def answer(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"description": description}
        if schema is not None:
            out["content"] = {"application/json": {"schema": schema}}
        return out

    def errs(*codes: int) -> dict[str, Any]:
        words = {400: "Bad request", 401: "No valid bearer token", 404: "Unknown domain or rule",
                 413: "Body too large",
                 422: "Invalid request", 503: "The store is unavailable"}  # fmt: skip
        return {str(c): {"description": words[c], **errors} for c in codes}

    obj = {"type": "object"}
    body = {"required": True, "content": {"application/json": {"schema": check_req}}}
    batch_body = {"required": True, "content": {"application/json": {"schema": batch_req}}}
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "ratewarden", "version": "1"},
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/check": {
                "post": {
                    "operationId": "check",
                    "summary": "Count one request against the limits that apply to it",
                    "requestBody": body,
                    "responses": {
                        "200": answer("The decision", check_res),
                        **errs(400, 401, 404, 413, 422, 503),
                    },
                }
            },
            "/v1/check/batch": {
                "post": {
                    "operationId": "checkBatch",
                    "summary": "Several checks, in order",
                    "requestBody": batch_body,
                    "responses": {
                        "200": answer("One decision per check", batch_res),
                        **errs(400, 401, 404, 413, 422, 503),
                    },
                }
            },
            "/v1/rules": {
                "get": {
                    "operationId": "rules",
                    "responses": {"200": answer("The rules in force", obj), **errs(401)},
                }
            },
            "/v1/quotas": {
                "get": {
                    "operationId": "quotas",
                    "summary": "The fleet quotas in the Redis store (up to 1000), by name",
                    "responses": {
                        "200": answer(
                            "Each quota's configuration and its members' sums", quota_list
                        ),
                        **errs(401),
                        "404": {"description": "The store is memory: no fleet quotas", **errors},
                        **errs(503),
                    },
                }
            },
            "/v1/quotas/{name}": {
                "get": {
                    "operationId": "quota",
                    "summary": "One fleet quota: configuration, effective total, live members",
                    "parameters": [
                        {
                            "name": "name",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:/-]{1,200}$"},
                        }
                    ],
                    "responses": {
                        "200": answer("The quota", quota),
                        **errs(400, 401),
                        "404": {"description": "No such quota, or the store is memory", **errors},
                        **errs(503),
                    },
                }
            },
            "/v1/reload": {
                "post": {
                    "operationId": "reload",
                    "summary": "Load the rule file again; a bad file leaves the rules in force",
                    "responses": {"200": answer("Reloaded", obj), **errs(401, 422)},
                }
            },
            "/v1/keys/{key}": {
                "delete": {
                    "operationId": "resetKey",
                    "parameters": [
                        {
                            "name": "key",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string", "minLength": 1},
                        },
                        {
                            "name": "rule",
                            "in": "query",
                            "required": False,
                            "schema": {"type": "string"},
                        },
                    ],
                    "responses": {"200": answer("Forgotten", obj), **errs(400, 401, 404)},
                }
            },
            # a gateway's subrequest may come with the original request's method
            "/auth": {
                method: {
                    "operationId": f"auth_{method}",
                    "summary": "For gateways: the original request described by headers",
                    "responses": {
                        "200": answer("Allowed"),
                        "429": answer("Over the limit", problem),
                        **errs(400, 401, 503),
                    },
                }
                for method in (m.lower() for m in AUTH_METHODS)
            },
            "/healthz": {
                "get": {
                    "operationId": "health",
                    "security": [],
                    "responses": {"200": answer("Alive", obj), "503": answer("Draining", obj)},
                }
            },
            "/readyz": {
                "get": {
                    "operationId": "ready",
                    "security": [],
                    "responses": {"200": answer("Ready", obj), "503": answer("Not ready", obj)},
                }
            },
            "/metrics": {
                "get": {
                    "operationId": "metrics",
                    "responses": {
                        "200": {
                            "description": "Prometheus text format",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        },
                        **errs(401),
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "responses": {"200": answer("This document", obj), **errs(401)},
                }
            },
        },
    }
    if not secured:
        del document["security"]
        for operation in _operations(document):
            operation.pop("security", None)
    elif open_checks:
        for path in ("/v1/check", "/v1/check/batch", "/v1/rules", "/v1/quotas",
                     "/v1/quotas/{name}", "/auth", "/metrics", "/openapi.json"):  # fmt: skip
            for operation in document["paths"][path].values():
                operation["security"] = []
    return document


def _operations(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [op for item in document["paths"].values() for op in item.values()]
