"""``ratewarden serve``: the HTTP API, Envoy's RLS v3 over gRPC, and the
gateway endpoint, over the rule engine (``pip install ratewarden[server,grpc]``).

    service = Service("rules.yaml", AsyncMemoryStore())   # what both transports call
    app = App(service, token=None)                        # an ASGI app
    GrpcServer(service, "127.0.0.1:8081")                 # RLS v3, health, reflection

``import ratewarden`` imports none of this; the gRPC half needs the ``grpc`` extra
and is imported only through ``ratewarden.server._grpc``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._app import App, auth_attributes, openapi
    from ._check_json import outcome_result
    from ._process import run
    from ._quotas import MAX_LISTED, summary
    from ._refusals import InvalidRequest
    from ._serve import ServeOptions, add_arguments, options_from
    from ._service import Service
    from ._shapes import BatchRequest, BatchResult, CheckRequest, CheckResult, DescriptorStatus

# Imported on first use, so that `ratewarden serve --help` and `ratewarden demo`
# do not pay for the rule engine, prometheus-client and the HTTP server at start-up.
_WHERE = {
    "App": "_app", "auth_attributes": "_request", "openapi": "_openapi",
    "BatchRequest": "_shapes", "BatchResult": "_shapes", "CheckRequest": "_shapes",
    "CheckResult": "_shapes", "DescriptorStatus": "_shapes",
    "ServeOptions": "_serve", "add_arguments": "_serve", "options_from": "_serve",
    "run": "_process", "InvalidRequest": "_refusals", "Service": "_service",
    "MAX_LISTED": "_quotas", "summary": "_quotas", "outcome_result": "_check_json",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "MAX_LISTED",
    "App",
    "BatchRequest",
    "BatchResult",
    "CheckRequest",
    "CheckResult",
    "DescriptorStatus",
    "InvalidRequest",
    "ServeOptions",
    "Service",
    "add_arguments",
    "auth_attributes",
    "openapi",
    "options_from",
    "outcome_result",
    "run",
    "summary",
]
