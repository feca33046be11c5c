"""``ratewarden serve``: the HTTP API, Envoy's RLS v3 over gRPC, and the
gateway endpoint, over the rule engine (``pip install ratewarden[server,grpc]``).

    service = Service("rules.yaml", AsyncMemoryStore())   # what both transports call
    app = App(service, token=None)                        # an ASGI app
    GrpcServer(service, "127.0.0.1:8081")                 # RLS v3, health, reflection

``import ratewarden`` imports none of this; the gRPC half needs the ``grpc`` extra
and is imported only by ``ratewarden.server._grpc``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._app import App, auth_attributes, openapi
    from ._core import BatchRequest, BatchResult, CheckRequest, CheckResult, DescriptorStatus
    from ._serve import ServeOptions, add_arguments, options_from, run
    from ._service import InvalidRequest, Service

# Imported on first use, so that `ratewarden serve --help` and `ratewarden demo`
# do not pay for the rule engine, prometheus-client and uvicorn at start-up.
_WHERE = {
    "App": "_app", "auth_attributes": "_authattrs", "openapi": "_openapi",
    "BatchRequest": "_core", "BatchResult": "_core", "CheckRequest": "_core",
    "CheckResult": "_core", "DescriptorStatus": "_core",
    "ServeOptions": "_serve", "add_arguments": "_serve", "options_from": "_serve", "run": "_serve",
    "InvalidRequest": "_service", "Service": "_service",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
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
    "run",
]
