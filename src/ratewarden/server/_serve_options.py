"""The options of ``ratewarden serve``: its flags, what they are read into
(`ServeOptions`), their checks, and the store they name. Parsing them imports
neither the server extra nor a store's client: `ratewarden serve --help`, and a
bad flag's error, come before either is loaded.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import re
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path

from ..envoy import EnvoyOptions, apply_environment, envoy_options
from ..envoy import add_arguments as envoy_arguments
from ..primitives import ConfigurationError
from ..stores import AsyncMemoryStore, AsyncStore
from ._addresses import LOOPBACK, listen_address, parse_address
from ._connection_limits import ConnectionLimits, ServerLimits

__all__ = [
    "DEFAULT_LIMITS",
    "ServeOptions",
    "add_arguments",
    "check_options",
    "make_store",
    "options_from",
]

DEFAULT_HTTP = f"{LOOPBACK}:8080"
DEFAULT_GRPC = f"{LOOPBACK}:8081"
DEFAULT_LIMITS = ConnectionLimits()
DEFAULT_SERVER_LIMITS = ServerLimits()


def demo_rules() -> str:
    """The example rule file shipped in the package (``--demo``): the same as the
    repository's examples/rules.yaml, found in an installed package too."""
    demo = resources.files("ratewarden.server").joinpath("demo", "rules.yaml")
    if not demo.is_file():
        raise ConfigurationError("--demo: the example rules are not in this installation")
    return str(demo)


@dataclass(frozen=True)
class ServeOptions:
    config: str | None = None  # the rule file; None: no rules
    demo: bool = False  # config is the shipped example file
    store: str = "memory"
    http: str | None = DEFAULT_HTTP
    grpc: str | None = DEFAULT_GRPC
    envoy_config: tuple[str, ...] = ()
    domain: str = "ratewarden"
    token: str | None = None
    open_checks: bool = False
    max_body: int = 64 * 1024
    max_keys: int = 1_000_000
    store_timeout: float = 0.05
    workers: int = 1
    instances: int | None = None  # sharing the limits, for local_fallback; None: workers
    drain: float = 10.0
    log_format: str = "json"
    log_level: str = "info"
    grpc_tls: tuple[str | None, str | None, str | None] = (None, None, None)
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    server_limits: ServerLimits = field(default_factory=ServerLimits)
    quota_member_metrics: bool = False
    envoy: EnvoyOptions = field(default_factory=EnvoyOptions)
    reload_interval: float = 1.0  # seconds between looks at the rule file; 0: never
    grpc_missing: bool = False  # --grpc left to its default, off for want of the grpc extra
    otel: bool = False  # export the metrics over OTLP too, as the OTEL_* environment says


_LIMIT_FLAGS = {f.name: "--" + f.name.replace("_", "-") for f in fields(ConnectionLimits)}
_SERVER_LIMIT_FLAGS = {f.name: "--" + f.name.replace("_", "-") for f in fields(ServerLimits)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--config", "--rules", dest="config", metavar="RULES.yaml",
        help="the rule file (default none: no rules; --demo for the shipped ones)")  # fmt: skip
    add("--demo", action="store_true",
        help="serve the example rules shipped with ratewarden (examples/rules.yaml), "
        "for trying the service out")  # fmt: skip
    add("--config-reload-interval", type=float, default=1.0, metavar="SECONDS",
        help="look for a changed rule file this often and reload it (default 1; 0: only on "
        "SIGHUP and /v1/reload)")  # fmt: skip
    add("--store", default="memory", metavar="URL",
        help="memory (default), redis://, rediss://, unix://, redis+cluster://h:p,h:p "
        "or redis+sentinel://h:p/service")  # fmt: skip
    add("--http", default=DEFAULT_HTTP, metavar="HOST:PORT",
        help=f"the HTTP API (default {DEFAULT_HTTP}; a bare PORT is {LOOPBACK}:PORT; "
        "'off' for none)")  # fmt: skip
    add("--grpc", metavar="HOST:PORT",
        help=f"Envoy's RLS v3 and Rate Limit Quota Service over gRPC (default {DEFAULT_GRPC}"
        " where the grpc extra is "
        f"installed, else off; a bare PORT is {LOOPBACK}:PORT; 'off' for none)")  # fmt: skip
    add("--envoy-config", action="append", default=[], metavar="FILE|DIR",
        help="an envoyproxy/ratelimit config file, or a directory of them (repeat; "
        "default none)")  # fmt: skip
    add("--domain", default="ratewarden",
        help="the envoy domain whose descriptors the rule file decides (default "
        "ratewarden)")  # fmt: skip
    add("--token-file", metavar="FILE",
        help="a bearer token every endpoint but health needs (or $RATEWARDEN_TOKEN)")  # fmt: skip
    add("--open-checks", action="store_true",
        help="with a token: checks, /auth, rules and metrics need none "
        "(reload and key resets still do)")  # fmt: skip
    add("--max-body", type=int, default=64 * 1024, metavar="BYTES",
        help="the largest request body the HTTP API reads; a larger one is a 413 "
        "(default 65536)")  # fmt: skip
    limits = DEFAULT_LIMITS
    add("--max-connections", type=int, default=limits.max_connections, metavar="N",
        help="open connections each listener keeps; at it, a new one closes the one idle "
        "longest (else, HTTP, a request arriving past --partial-grace), and is refused "
        f"only when none can go (default {limits.max_connections}, lowered to fit the "
        "open-file limit)")  # fmt: skip
    add("--idle-timeout", type=float, default=limits.idle_timeout, metavar="SECONDS",
        help="close a connection with nothing in flight after this long (default "
        f"{limits.idle_timeout:g})")  # fmt: skip
    add("--header-timeout", type=float, default=limits.header_timeout, metavar="SECONDS",
        help="a request's headers must arrive within this (HTTP 408; default "
        f"{limits.header_timeout:g})")  # fmt: skip
    add("--body-timeout", type=float, default=limits.body_timeout, metavar="SECONDS",
        help="a request's body must arrive within this once its headers are in (HTTP 408, "
        f"HTTP/2 a reset stream; default {limits.body_timeout:g})")  # fmt: skip
    add("--max-header-bytes", type=int, default=limits.max_header_bytes, metavar="BYTES",
        help=f"a request's headers (HTTP 431; default {limits.max_header_bytes})")  # fmt: skip
    add("--partial-grace", type=float, default=limits.partial_grace, metavar="SECONDS",
        help="at --max-connections with none idle, an HTTP request still arriving after "
        "this long is closed to admit a new connection (at --max-connections-per-peer, "
        "the address's own go first, whatever their age) "
        f"(default {limits.partial_grace:g})")  # fmt: skip
    shared = DEFAULT_SERVER_LIMITS
    add("--max-buffered-bytes", type=int, default=shared.max_buffered_bytes, metavar="BYTES",
        help="bytes of unfinished request bodies the process holds, both listeners "
        "together; past it the body held longest is dropped (HTTP 503, gRPC "
        f"RESOURCE_EXHAUSTED; default {shared.max_buffered_bytes})")  # fmt: skip
    add("--max-stream-bytes", type=int, default=shared.max_stream_bytes, metavar="BYTES",
        help="an HTTP/2 request's body, and the flow-control window of its stream "
        f"(default {shared.max_stream_bytes})")  # fmt: skip
    add("--max-connections-per-peer", type=int, default=shared.max_connections_per_peer,
        metavar="N",
        help="connections one source address keeps on each listener; past it, and at "
        "--max-connections, the one idle longest (else, HTTP, one whose request is still "
        "arriving past --partial-grace) is closed to admit the new one "
        f"(default {shared.max_connections_per_peer})")  # fmt: skip
    add("--max-keys", type=int, default=1_000_000, metavar="N",
        help="the memory store's bound: least recently used keys go first (default "
        "1000000)")  # fmt: skip
    add("--store-timeout", type=float, default=0.05, metavar="SECONDS",
        help="a Redis store call may take this long before the rules' on_failure "
        "decides (default 0.05)")  # fmt: skip
    add("--workers", type=int, default=1, metavar="N",
        help="processes sharing the ports (default 1; more only with a Redis store: "
        "the memory store is per process)")  # fmt: skip
    add("--instances", type=int, default=None, metavar="N",
        help="processes sharing the Redis store's limits, all hosts together: while Redis "
        "is unreachable, rules with on_failure: local_fallback enforce limit / N in each "
        "(default: --workers)")  # fmt: skip
    add("--drain", type=float, default=10.0, metavar="SECONDS",
        help="on SIGTERM, how long requests in flight may take to finish (default 10)")  # fmt: skip
    add("--log-format", choices=("json", "text"), default="json",
        help="log lines on stderr as JSON or plain text (default json)")  # fmt: skip
    add("--log-level", default="info", choices=("debug", "info", "warning", "error"),
        help="default info; debug is ratewarden's own: libraries stay at info, those that "
        "log headers at warning")  # fmt: skip
    add("--grpc-cert", metavar="PEM", help="TLS for gRPC: certificate chain")
    add("--grpc-key", metavar="PEM", help="TLS for gRPC: private key")
    add("--grpc-client-ca", metavar="PEM",
        help="mTLS for gRPC: clients must show a certificate from this CA")  # fmt: skip
    add("--quota-member-metrics", action="store_true",
        help="with a Redis store: the fleet quota gauges on /metrics per member too "
        "(a series per resource and member id)")  # fmt: skip
    add("--otel", action="store_true",
        help="export the metrics with OpenTelemetry too (OTLP over HTTP), configured by "
        "the OTEL_* environment variables; /metrics stays (the otel extra)")  # fmt: skip
    envoy_arguments(parser)


def options_from(args: argparse.Namespace) -> ServeOptions:
    if getattr(args, "envoy_env", False):
        defaults = argparse.Namespace()
        serve = argparse.ArgumentParser(add_help=False)
        add_arguments(serve)
        serve.parse_args([], defaults)
        apply_environment(args, defaults)
    token = os.environ.get("RATEWARDEN_TOKEN") or None
    if args.token_file is not None:
        try:
            token = Path(args.token_file).read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"--token-file {args.token_file}: {exc}") from exc
        if not token:
            raise ConfigurationError(f"{args.token_file} holds no token")
    if args.demo and args.config is not None:
        raise ConfigurationError("--demo serves the example rules: give it or --config, not both")
    grpc = _grpc_address(args.grpc)
    return ServeOptions(
        config=demo_rules() if args.demo else args.config,
        demo=args.demo,
        store=args.store,
        http=listen_address(args.http, "--http"),
        grpc=grpc,
        envoy_config=tuple(args.envoy_config),
        domain=args.domain,
        token=token,
        open_checks=args.open_checks,
        max_body=args.max_body,
        max_keys=args.max_keys,
        store_timeout=args.store_timeout,
        workers=args.workers,
        instances=args.instances,
        drain=args.drain,
        log_format=args.log_format,
        log_level=args.log_level,
        grpc_tls=(args.grpc_cert, args.grpc_key, args.grpc_client_ca),
        limits=limits_from(args),
        server_limits=server_limits_from(args),
        quota_member_metrics=args.quota_member_metrics,
        envoy=envoy_options(args),
        reload_interval=args.config_reload_interval,
        grpc_missing=args.grpc is None and grpc is None,  # left to a default that is off
        otel=args.otel,
    )


def _grpc_address(given: str | None) -> str | None:
    """``--grpc`` as given; not given, the default where the grpc extra is
    installed and off where it is not (`run` says so once at start).

    Given without the extra, the import error reaches the command line, which
    names the extra to install."""
    if given is None:
        return DEFAULT_GRPC if grpc_installed() else None
    address = listen_address(given, "--grpc")
    if address is not None:
        # the grpc extra, named by the command line if a part is missing
        from grpc_tools import protoc  # noqa: F401, PLC0415

        from . import _grpc_server  # noqa: F401, PLC0415
    return address


def grpc_installed() -> bool:
    """Whether every package the grpc extra brings is here (protobuf alone may
    come with another extra: otel's)."""
    for module in ("grpc_tools", "google.protobuf", "hpack"):
        try:
            if importlib.util.find_spec(module) is None:
                return False
        except ModuleNotFoundError:  # "google" itself is missing
            return False
    return True


def limits_from(args: argparse.Namespace) -> ConnectionLimits:
    try:
        return ConnectionLimits(**{name: getattr(args, name) for name in _LIMIT_FLAGS})
    except ConfigurationError as exc:
        raise _in_flags(exc, _LIMIT_FLAGS) from None


def server_limits_from(args: argparse.Namespace) -> ServerLimits:
    try:
        return ServerLimits(**{name: getattr(args, name) for name in _SERVER_LIMIT_FLAGS})
    except ConfigurationError as exc:
        raise _in_flags(exc, _SERVER_LIMIT_FLAGS) from None


def _in_flags(exc: ConfigurationError, flags: dict[str, str]) -> ConfigurationError:
    """The error with the options' names in it, not the fields'."""
    message = str(exc)
    for name, flag in sorted(flags.items(), key=lambda item: -len(item[0])):
        message = re.sub(rf"\b{name}\b", flag, message)
    return ConfigurationError(message)


def make_store(url: str, options: ServeOptions) -> AsyncStore:
    if url in ("memory", "memory://"):
        return AsyncMemoryStore(max_keys=options.max_keys)
    check_store_url(url)
    from ..stores.redis import AsyncRedisStore  # noqa: PLC0415 - only with a Redis store

    instances = options.workers if options.instances is None else options.instances
    return AsyncRedisStore(url, timeout=options.store_timeout, instances=instances)


def check_store_url(url: str) -> None:
    """A Redis URL the stores' connection module accepts, and redis-py to open it."""
    try:
        from ..stores.redis.connection import SCHEMES  # noqa: PLC0415 - only with a Redis store
    except ImportError as exc:
        raise ConfigurationError(
            f"--store takes 'memory' or a Redis URL, got {url!r}; a Redis store needs"
            " redis-py: pip install 'ratewarden[server,redis]'"
        ) from exc
    if not url.startswith(SCHEMES):
        raise ConfigurationError(f"--store takes 'memory' or a Redis URL, got {url!r}")


def check_options(options: ServeOptions) -> None:
    if options.http is None and options.grpc is None:
        raise ConfigurationError("--http off and --grpc off: nothing to serve")
    if type(options.workers) is not int or options.workers < 1:
        raise ConfigurationError(f"--workers must be >= 1, got {options.workers!r}")
    if options.instances is not None and (
        type(options.instances) is not int or options.instances < 1
    ):
        raise ConfigurationError(f"--instances must be >= 1, got {options.instances!r}")
    memory = options.store in ("memory", "memory://")
    if not memory:
        check_store_url(options.store)
    if options.workers > 1 and memory:
        raise ConfigurationError(
            f"--workers {options.workers} with the memory store: each process would keep "
            f"its own counters and admit the whole limit, {options.workers} times the rate. "
            "Use --store redis://... for several workers (or one worker)."
        )
    if options.workers > 1 and options.grpc is not None and options.grpc.endswith(":0"):
        raise ConfigurationError("--workers needs a fixed --grpc port (the workers share it)")
    if not (math.isfinite(options.reload_interval) and options.reload_interval >= 0):
        raise ConfigurationError(
            "--config-reload-interval must be a finite number >= 0, got "
            f"{options.reload_interval!r}"
        )
    if not (math.isfinite(options.drain) and options.drain >= 0):
        raise ConfigurationError(f"--drain must be a finite number >= 0, got {options.drain!r}")
    for address, what in ((options.http, "--http"), (options.grpc, "--grpc")):
        if address is not None:
            parse_address(address, what)
    if options.http is not None and options.grpc is not None:
        _distinct(options.http, options.grpc)
    if options.otel:
        from ._otel import check_environment  # noqa: PLC0415 - only with --otel

        check_environment()


def _distinct(http: str, grpc: str) -> None:
    """The two listeners on one port would fail with the system's "address
    already in use", as if another program held it: say that it is our own."""
    http_host, http_port = parse_address(http, "--http")
    grpc_host, grpc_port = parse_address(grpc, "--grpc")
    if http_port != grpc_port or http_port == 0:
        return
    if _overlap(http_host, grpc_host):
        raise ConfigurationError(
            f"--http {http} and --grpc {grpc} ask for the same port: each listener needs its own"
        )


def _overlap(a: str, b: str) -> bool:
    """Whether two listening hosts share addresses: the same one; IPv4's
    wildcard and any IPv4 address; IPv6's wildcard (dual-stack) and any."""
    a, b = (_LOCALHOST.get(host, host) for host in (a, b))
    if a == b or "::" in (a, b):
        return True
    v6 = ":" in a, ":" in b
    return "0.0.0.0" in (a, b) and v6 == (False, False)


_LOCALHOST = {"localhost": "127.0.0.1"}
