"""``ratewarden serve``: the HTTP API, Envoy's RLS v3 over gRPC, and the
gateway endpoint, over the rule engine (``pip install ratewarden[server,grpc]``).

    service = Service("rules.yaml", AsyncMemoryStore())   # what both transports call
    app = App(service, token=None)                        # an ASGI app
    GrpcServer(service, "127.0.0.1:8081")                 # RLS v3, health, reflection

What each module holds:

- the command: ``_serve_options`` (its options, their checks, the store they
  name), ``_serve`` (both servers on one event loop, SIGTERM drains, SIGHUP and
  the watchers reload), ``_process`` (the
  open-file limit, the event loop, ``--workers``), ``_addresses`` (``HOST:PORT``
  options, the socket the workers share), ``_logging`` (lines with secrets
  blanked);
- the service, built from parts each given only what it needs: ``_service``
  (`Service`), ``_rules_in_force`` (the rules answered by, and their reloads),
  ``_counters`` (metrics, dashboard figures, envoy's statistics), ``_readiness``
  (whether the store answers);
- a check's path: read once at the edge into a `Check` (``_check_json`` for the
  HTTP API, ``_rls`` for Envoy's RLS), decided once (``_checker``: the `Checker`;
  ``_verdict``: what it decided), written back by the front end that read it
  (``_check_json``, ``_rls_wire``); ``_refusals``: the requests refused, as
  exceptions both front ends answer;
- the HTTP API: ``_app`` (a plain ASGI app), ``_http_input`` (strict JSON bodies),
  ``_shapes`` (the msgspec request and answer types), ``_openapi``, ``_admin_api``
  (load signals), ``_quotas`` and ``_quota_reader`` (``/v1/quotas``), ``_metrics``
  (Prometheus), ``_otel`` and ``_otel_latency`` (the same counts over OTLP,
  ``--otel``), ``_dashboard`` and ``_dashstats`` (the live dashboard);
- our HTTP/1.1 server on httptools: ``_http_server`` (serving and draining),
  ``_http_listener`` (what a listener's connections share), ``_http`` (one
  connection), ``_http_cycle`` (one request's exchange with the app),
  ``_connection_limits`` (what one client may hold);
- gRPC: ``_grpc_server`` (RLS, health and reflection on one listener), ``_protos`` (the
  messages, compiled when first needed); ``h2/`` is our HTTP/2 server, a protocol
  layer apart from the calls it carries.

``import ratewarden`` imports none of this; the gRPC half needs the ``grpc`` extra
and is imported only through ``ratewarden.server._grpc_server``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._app import App, auth_attributes, openapi
    from ._check_json import outcome_result
    from ._otel import available as otel_available
    from ._process import run
    from ._quotas import MAX_LISTED, summary
    from ._refusals import InvalidRequest
    from ._serve_options import ServeOptions, add_arguments, options_from
    from ._service import Service
    from ._shapes import BatchRequest, BatchResult, CheckRequest, CheckResult, DescriptorStatus

# Imported on first use, so that `ratewarden serve --help` and `ratewarden demo`
# do not pay for the rule engine, prometheus-client and the HTTP server at start-up.
_WHERE = {
    "App": "_app", "auth_attributes": "_http_input", "openapi": "_openapi",
    "BatchRequest": "_shapes", "BatchResult": "_shapes", "CheckRequest": "_shapes",
    "CheckResult": "_shapes", "DescriptorStatus": "_shapes",
    "ServeOptions": "_serve_options", "add_arguments": "_serve_options",
    "options_from": "_serve_options",
    "run": "_process", "InvalidRequest": "_refusals", "Service": "_service",
    "MAX_LISTED": "_quotas", "summary": "_quotas", "outcome_result": "_check_json",
    "otel_available": "_otel",
}  # fmt: skip
_NAMES = {"otel_available": "available"}  # a name here that differs from its module's


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), _NAMES.get(name, name))


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
    "otel_available",
    "outcome_result",
    "run",
    "summary",
]
