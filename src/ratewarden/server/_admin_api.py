"""The HTTP API's load signals, which adaptive rules scale their limits by:

    PUT /v1/load/{signal}   {"value": 850}  (admin)

A value set here is this process's alone: the load an adaptive limit follows
is the load of the process that serves the requests (its latency, its queue),
and each instance is fed its own. The counters stay shared in the store; an
instance under load charges its requests more of them (see `ratewarden._adaptive`).

The HTTP API's runtime overrides:

    GET    /v1/overrides         the overrides in force and the audit trail
    PUT    /v1/overrides/{rule}  {"limits": ["500/minute"], "for": "30m", "reason": "...",
                                  "by": "..."}  (admin)
    DELETE /v1/overrides/{rule}  end one now; ?reason=... (admin)

With a Redis store they are in Redis and every instance on it applies them
(``"shared": true``); with the memory store, this process alone.
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import parse_qs

import msgspec

from ..primitives import ConfigurationError
from ..rules import AsyncRuleEngine
from ..rules.overrides import MAX_BY, AuditEntry, RuntimeOverride, UnknownRule, check_text
from ._http_input import HTTPError, parse, scan_duplicates, tail
from ._refusals import NotFound, Unprocessable

__all__ = [
    "LoadRequest",
    "LoadSet",
    "OverrideList",
    "OverrideRequest",
    "clear_override",
    "list_overrides",
    "load_openapi_paths",
    "override_list",
    "override_openapi_paths",
    "overrides_shared",
    "set_load",
    "set_override",
]

LOAD_PREFIX = b"/v1/load/"


class LoadRequest(msgspec.Struct, forbid_unknown_fields=True):
    """A load signal's new value: a finite number (milliseconds, a queue's length...)."""

    value: float


class EffectiveLimit(msgspec.Struct):
    limit: int  # without the load: the rule's (or its override's), in requests
    effective_limit: int  # what the load leaves of it now


class LoadSet(msgspec.Struct):
    signal: str
    value: float
    limits: dict[str, EffectiveLimit]  # every limit that reads the signal, by name
    shared: bool  # always false: each instance is fed its own load


_decode_load = msgspec.json.Decoder(LoadRequest).decode
_encode = msgspec.json.Encoder().encode


async def set_load(engine: AsyncRuleEngine, scope: Any, body: bytes) -> bytes:
    try:
        signal = tail(scope, LOAD_PREFIX)
    except UnicodeDecodeError:
        raise HTTPError(400, "a signal name must be UTF-8 once %-decoded") from None
    if not signal:
        raise HTTPError(400, "no signal named: PUT /v1/load/{signal}")
    request: LoadRequest = parse(_decode_load, body)
    scan_duplicates(body)
    return _encode(_set_load(engine, signal, request.value))


def _set_load(engine: AsyncRuleEngine, signal: str, value: object) -> dict[str, Any]:
    """Feed the load signal to this process's engine alone, as the load is this
    process's (see `ratewarden._adaptive`); what the adaptive limits reading it
    are now. `NotFound` for a signal no rule reads, `Unprocessable` for a value
    that is not a finite number."""
    if signal not in engine.ruleset.signals:
        read = ", ".join(sorted(engine.ruleset.signals)) or "none"
        raise NotFound(f"no rule reads the load signal {signal[:100]!r} (the rules read: {read})")
    if type(value) is bool or not isinstance(value, int | float) or not math.isfinite(value):
        raise Unprocessable(f"a load signal's value is a finite number, got {value!r}")
    engine.set_load(signal, float(value))
    readers = {
        spec.name
        for r in engine.ruleset.rules
        if r.rule.adaptive is not None and r.rule.adaptive.signal == signal
        for spec in r.limits
    }
    limits = {
        name: {"limit": full, "effective_limit": effective}
        for name, (full, effective) in engine.effective_limits().items()
        if name in readers
    }
    return {"signal": signal, "value": float(value), "limits": limits, "shared": False}


def load_openapi_paths(problem: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The path of this API for the OpenAPI document, and the schemas it uses."""
    (request, done), components = msgspec.json.schema_components(
        [LoadRequest, LoadSet], ref_template="#/components/schemas/{name}"
    )

    def json_of(schema: dict[str, Any]) -> dict[str, Any]:
        return {"content": {"application/json": {"schema": schema}}}

    error = json_of(problem)
    signal = {"name": "signal", "in": "path", "required": True, "schema": {"type": "string"}}
    paths = {
        "/v1/load/{signal}": {
            "put": {
                "operationId": "setLoad",
                "summary": "Feed a load signal that adaptive rules scale their limits by"
                " (this instance only)",
                "parameters": [signal],
                "requestBody": {"required": True, **json_of(request)},
                "responses": {
                    "200": {"description": "The limits that read the signal, now", **json_of(done)},
                    "400": {"description": "Malformed JSON or signal name", **error},
                    "401": {"description": "No valid bearer token", **error},
                    "404": {"description": "No rule reads this signal", **error},
                    "413": {"description": "Body too large", **error},
                    "422": {"description": "The value is not a finite number", **error},
                },
            }
        }
    }
    return paths, components


OVERRIDE_PREFIX = b"/v1/overrides/"
MAX_CLAIMED = MAX_BY - 80  # room for " (from <an IPv6 address>)" in the audit's ``by``


class OverrideRequest(msgspec.Struct, forbid_unknown_fields=True):
    """A new override: ``limits`` replace the rule's rates for ``for`` (seconds
    or text such as "30m"); ``reason`` goes into the audit trail with ``by``."""

    limits: list[str] | str
    duration: float | str = msgspec.field(name="for")
    reason: str
    by: str = ""


class OverrideList(msgspec.Struct):
    overrides: list[RuntimeOverride]
    audit: list[AuditEntry]
    shared: bool  # in the store, for every instance on it; else this process's


class OverrideSet(msgspec.Struct):
    override: RuntimeOverride
    shared: bool


class OverrideCleared(msgspec.Struct):
    rule: str
    removed: bool
    shared: bool


_decode_override = msgspec.json.Decoder(OverrideRequest).decode


def _who(scope: dict[str, Any] | Any, claimed: object) -> str:
    """Who made a change, as the audit trail says: the name the caller gives
    (unverified: the token says the caller may, not who it is) and its address.
    The name is checked as given, so that a refusal counts the caller's
    characters, not the address added after them."""
    try:
        name = check_text("by", claimed, MAX_CLAIMED, required=False)
    except ConfigurationError as exc:
        raise HTTPError(422, str(exc)) from None
    client = scope.get("client")
    peer = "?" if not client else str(client[0])[:64]
    return f"{name or 'api'} (from {peer})"


def _rule(scope: Any) -> str:
    try:
        rule = tail(scope, OVERRIDE_PREFIX)
    except UnicodeDecodeError:
        raise HTTPError(400, "a rule name must be UTF-8 once %-decoded") from None
    if not rule:
        raise HTTPError(400, "no rule given: /v1/overrides/{rule}")
    return rule


def overrides_shared(engine: AsyncRuleEngine) -> bool:
    """True when overrides live in the store, for every instance on it."""
    source = engine.overrides_source
    return source is not None and source.shared


async def override_list(engine: AsyncRuleEngine) -> OverrideList:
    """The overrides in force and the last 100 changes."""
    overrides = await engine.alist_overrides()
    audit = await engine.aoverride_audit(100)
    return OverrideList(overrides, audit, overrides_shared(engine))


async def list_overrides(engine: AsyncRuleEngine) -> bytes:
    return _encode(await override_list(engine))


async def set_override(engine: AsyncRuleEngine, scope: Any, body: bytes) -> bytes:
    rule = _rule(scope)
    request: OverrideRequest = parse(_decode_override, body)
    scan_duplicates(body)
    try:
        override = await engine.aset_override(
            rule, request.limits, duration=request.duration, reason=request.reason,
            by=_who(scope, request.by),
        )  # fmt: skip
    except UnknownRule as exc:
        raise HTTPError(404, str(exc)) from None
    except ConfigurationError as exc:
        raise HTTPError(422, str(exc)) from None
    return _encode(OverrideSet(override, overrides_shared(engine)))


async def clear_override(engine: AsyncRuleEngine, scope: Any) -> bytes:
    rule = _rule(scope)
    try:
        query = parse_qs(scope.get("query_string", b"").decode(), errors="strict")
    except UnicodeDecodeError:
        raise HTTPError(400, "the reason must be UTF-8 once %-decoded") from None
    reason = query.get("reason", [""])[-1]
    by = query.get("by", [""])[-1]
    try:
        removed = await engine.aclear_override(rule, reason=reason, by=_who(scope, by))
    except ConfigurationError as exc:
        raise HTTPError(422, str(exc)) from None
    return _encode(OverrideCleared(rule, removed, overrides_shared(engine)))


def override_openapi_paths(problem: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The paths of this API for the OpenAPI document, and the schemas they use."""
    (request, listed, done, cleared), components = msgspec.json.schema_components(
        [OverrideRequest, OverrideList, OverrideSet, OverrideCleared],
        ref_template="#/components/schemas/{name}",
    )

    def json_of(schema: dict[str, Any]) -> dict[str, Any]:
        return {"content": {"application/json": {"schema": schema}}}

    error = json_of(problem)
    rule = {"name": "rule", "in": "path", "required": True, "schema": {"type": "string"}}
    text = {"type": "string"}
    paths = {
        "/v1/overrides": {
            "get": {
                "operationId": "overrides",
                "summary": "The runtime overrides in force, and the last 100 changes",
                "responses": {
                    "200": {"description": "Overrides and audit trail", **json_of(listed)},
                    "401": {"description": "No valid bearer token", **error},
                    "503": {"description": "The store is unavailable", **error},
                },
            }
        },
        "/v1/overrides/{rule}": {
            "put": {
                "operationId": "setOverride",
                "summary": "Replace a rule's rates for a while, on every instance on the store",
                "parameters": [rule],
                "requestBody": {"required": True, **json_of(request)},
                "responses": {
                    "200": {"description": "The override in force", **json_of(done)},
                    "400": {"description": "Malformed JSON", **error},
                    "401": {"description": "No valid bearer token", **error},
                    "404": {"description": "No such rule in force", **error},
                    "413": {"description": "Body too large", **error},
                    "422": {"description": "Rates, duration or reason refused", **error},
                    "503": {"description": "The store is unavailable", **error},
                },
            },
            "delete": {
                "operationId": "clearOverride",
                "summary": "End a rule's override now",
                "parameters": [
                    rule,
                    {"name": "reason", "in": "query", "required": False, "schema": text},
                    {"name": "by", "in": "query", "required": False, "schema": text},
                ],
                "responses": {
                    "200": {"description": "Whether one was in force", **json_of(cleared)},
                    "400": {"description": "Malformed rule name", **error},
                    "401": {"description": "No valid bearer token", **error},
                    "422": {"description": "Reason refused", **error},
                    "503": {"description": "The store is unavailable", **error},
                },
            },
        },
    }
    return paths, components
