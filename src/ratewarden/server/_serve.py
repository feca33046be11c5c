"""``ratewarden serve``: our HTTP/1.1 server and HTTP/2 gRPC server on one event
loop, and the service they answer for; SIGTERM drains, SIGHUP reloads, and
watchers reload the rule file and the envoy files when they change. Its options
are `_serve_options`'s; the process around it (the open-file limit, the event
loop, ``--workers``) is `_process`'s.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..primitives import ConfigurationError
from ..rules import RuleFile, RuleSet
from ._addresses import bind
from ._serve_options import ServeOptions, make_store

if TYPE_CHECKING:  # the server extra's: imported when serving, not when parsing flags
    from ._rules_in_force import RulesInForce

__all__ = ["no_rules", "serve"]

log = logging.getLogger("ratewarden.server")


def no_rules() -> RuleSet:
    """The rules of a service started without --config or --demo: none (envoy
    config files may still decide their domains)."""
    return RuleSet(RuleFile(rules=[]), [], None)


class _Servers:
    """The service's two servers on one event loop, started and drained together."""

    def __init__(self, options: ServeOptions, http_socket: socket.socket | None) -> None:
        self.options = options
        self.http_socket = http_socket
        self.grpc: Any = None
        self.http: Any = None
        self.where: list[str] = []

    async def start(self, service: Any) -> None:
        options = self.options
        await service.start()  # the store's runtime overrides, in force before any request
        if options.grpc is not None:
            from ._grpc_server import GrpcServer, parse_tls  # noqa: PLC0415 - the grpc extra

            self.grpc = GrpcServer(service, options.grpc, token=options.token,
                                   tls=parse_tls(*options.grpc_tls),
                                   reuse_port=options.workers > 1,
                                   limits=options.limits,
                                   server_limits=options.server_limits)  # fmt: skip
            await self.grpc.start()
            self.where.append(f"gRPC on {options.grpc.rpartition(':')[0]}:{self.grpc.port}")
        if options.http is not None:
            from ._app import App  # noqa: PLC0415 - the server extra, only when serving
            from ._http_server import HttpServer  # noqa: PLC0415

            if self.http_socket is None:
                self.http_socket = bind(options.http)
            # the client's address is the peer's: X-Forwarded-For is believed only
            # from the rule file's client_ip.trusted_proxies, in the app
            app = App(service, token=options.token, open_checks=options.open_checks,
                      max_body=options.max_body)  # fmt: skip
            self.http = HttpServer(app, self.http_socket, options.limits, options.max_body,
                                   options.server_limits)  # fmt: skip
            await self.http.start()
            host, port = self.http_socket.getsockname()[:2]
            self.where.insert(0, f"HTTP on http://{host}:{port}")
        if options.grpc_missing:
            self.where.append("gRPC off (Envoy's RLS needs: pip install 'ratewarden[grpc]')")

    async def run_until(self, stop: asyncio.Event, health: Any) -> None:
        await stop.wait()
        log.info("draining: up to %gs for requests in flight", self.options.drain)
        health.draining = True  # /healthz and /readyz say 503 from now on
        stopping: list[Any] = []
        if self.grpc is not None:
            stopping.append(self.grpc.stop(self.options.drain))
        if self.http is not None:
            stopping.append(self.http.drain(self.options.drain))
        await asyncio.gather(*stopping)

    async def close(self) -> None:
        if self.http is not None:
            self.http.close()
        if self.grpc is not None:
            await self.grpc.server.stop(0)


async def serve(
    options: ServeOptions,
    http_socket: socket.socket | None = None,
    ready: Callable[[], None] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT, then drain: health says 503 / NOT_SERVING,
    listeners close, requests in flight get ``options.drain`` seconds. ``ready``
    is called once the listeners are open."""
    from prometheus_client import disable_created_metrics  # noqa: PLC0415

    from ._service import Service  # noqa: PLC0415

    disable_created_metrics()  # type: ignore[no-untyped-call]  # a *_created series per rule doubles /metrics for nothing
    store = make_store(options.store, options)
    rules = no_rules() if options.config is None else options.config
    service = Service(rules, store, envoy_files=options.envoy_config,
                      domain=options.domain, quota_member_metrics=options.quota_member_metrics,
                      envoy_options=options.envoy,
                      store_url=_redact(options.store))  # fmt: skip
    # made now, so that an edit while the servers start is seen
    watchers: list[Any] = []
    if options.reload_interval > 0 and options.config is not None:
        watchers.append(service.engine.awatch(options.reload_interval, reload=service.reload_rules))
    if options.envoy_config and options.envoy.reload_interval > 0:
        watchers.append(service.envoy_watcher(options.envoy.reload_interval))
    servers = _Servers(options, http_socket)
    export = None
    if options.otel:
        from ._otel import OtelExport  # noqa: PLC0415 - the otel extra

        export = OtelExport(service)
        export.start()
    # The compiled rules and the imported modules live as long as the process:
    # moved out of the collector's reach, they do not lengthen every full
    # collection (a pause each request in flight then waits out)
    gc.collect()
    gc.freeze()
    watching: list[asyncio.Task[None]] = []
    try:
        await servers.start(service)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, _reload_soon, service.rules)
        watching = [loop.create_task(watcher.run()) for watcher in watchers]
        watching.append(loop.create_task(service.health.run()))
        memory = " (memory: counters live in this process only)" if (
            options.store == "memory") else ""  # fmt: skip
        rules = _rules_said(options, service.rules)
        print(f"ratewarden (pid {os.getpid()}): {', '.join(servers.where)}; {rules}; "
              f"store {_redact(options.store)}{memory}", flush=True)  # fmt: skip
        log.info("serving: %s", ", ".join(servers.where))
        if ready is not None:
            ready()
        await servers.run_until(stop, service.health)
        log.info("stopped")
    finally:
        for task in watching:
            task.cancel()
        await servers.close()
        if export is not None:  # what was counted since the last export goes out now
            await export.aclose()
        await service.aclose()


def _reload_soon(rules: RulesInForce) -> None:
    async def go() -> None:
        try:
            await rules.reload()
        except ConfigurationError as exc:  # the old rules stay; say why, as /v1/reload does
            log.error("SIGHUP: rules not reloaded, the previous rules stay in force: %s", exc)

    task = asyncio.get_running_loop().create_task(go())
    _background.add(task)
    task.add_done_callback(_background.discard)


_background: set[asyncio.Task[None]] = set()


def _rules_said(options: ServeOptions, rules: RulesInForce) -> str:
    """Which rules the banner says are in force: none, the file, or the demo's,
    and the envoy domains the --envoy-config files gave."""
    count = len(rules.engine.ruleset)
    if options.config is None:
        said = "rules: none (give --config FILE, or --demo for the example rules)"
    elif options.demo:
        said = f"rules: the demo's, {_rules(count)} on domain {rules.domain} ({options.config})"
    else:
        said = f"rules: {options.config}, {_rules(count)} on domain {rules.domain}"
    if options.envoy_config:
        envoy = rules.envoy
        domains = [] if envoy is None else sorted(envoy.domains)
        said += f"; envoy domains: {', '.join(domains) or 'none'}"
    entries = len(rules.quotas.rules)
    if entries:
        said += f"; Envoy quota (RLQS) entries: {entries}"
    return said


def _redact(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        return f"{scheme}://***@{rest.rpartition('@')[2]}"
    return url


def _rules(count: int) -> str:
    return f"{count} rule" if count == 1 else f"{count} rules"
