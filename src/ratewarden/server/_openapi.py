"""The HTTP API's OpenAPI 3.1 document, made from the msgspec types the app
decodes and encodes."""

from __future__ import annotations

from typing import Any

import msgspec

from ._admin_api import load_openapi_paths as load_paths
from ._admin_api import override_openapi_paths as override_paths
from ._http_input import AUTH_METHODS
from ._lease_api import lease_openapi_paths as lease_paths
from ._quotas import Quota, QuotaList
from ._settle_api import settle_openapi_paths as settle_paths
from ._shapes import BatchRequest, BatchResult, CheckRequest, CheckResult, Problem

__all__ = ["openapi"]


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
    attributes = {
        "type": "object",
        "properties": {"headers": {"anyOf": [strings, {"type": "null"}]}},
        "additionalProperties": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    }
    components["CheckRequest"]["properties"]["attributes"] = {
        "anyOf": [attributes, {"type": "null"}],
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
        words = {400: "Bad request", 401: "No valid bearer token", 404: "Unknown rule",
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
                        **errs(400, 401, 413, 422, 503),
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
                        **errs(400, 401, 413, 422, 503),
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
            "/": {
                "get": {
                    "operationId": "dashboard",
                    "summary": "The live dashboard's page; it holds no data, so needs no token",
                    "security": [],
                    "responses": {
                        "200": {
                            "description": "The page",
                            "content": {"text/html": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
            "/v1/events": {
                "get": {
                    "operationId": "events",
                    "summary": "The dashboard's feed: a 'snapshot' event a second, until the "
                    "client goes or the service drains",
                    "responses": {
                        "200": {
                            "description": "Server-Sent Events; each data line is a JSON snapshot",
                            # each event as schemathesis and OpenAPI 3.2 read a stream: its fields
                            "content": {
                                "text/event-stream": {
                                    "schema": {
                                        "type": "object",
                                        "properties": {
                                            "event": {"const": "snapshot"},
                                            "data": {"type": "string"},
                                        },
                                        "required": ["event", "data"],
                                    }
                                }
                            },
                        },
                        **errs(401),
                        "503": {"description": "Draining, or too many streams open", **errors},
                    },
                }
            },
        },
    }
    for more in (override_paths, load_paths, lease_paths, settle_paths):
        paths, schemas = more(problem)
        document["paths"].update(paths)
        document["components"]["schemas"].update(schemas)
    # an acquire's attributes are a check's (and must be given)
    components["AcquireRequest"]["properties"]["attributes"] = attributes
    if not secured:
        del document["security"]
        for operation in _operations(document):
            operation.pop("security", None)
    elif open_checks:
        for path in ("/v1/check", "/v1/check/batch", "/v1/acquire", "/v1/renew", "/v1/release",
                     "/v1/settle", "/v1/rules", "/v1/quotas",
                     "/v1/quotas/{name}", "/auth", "/metrics", "/openapi.json"):  # fmt: skip
            for operation in document["paths"][path].values():
                operation["security"] = []
    return document


def _operations(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [op for item in document["paths"].values() for op in item.values()]
