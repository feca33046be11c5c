"""``ratewarden serve``'s options for envoy domains, and, with ``--envoy-env``,
envoyproxy/ratelimit's environment variables where they have a counterpart:

==========================================  =====================================
RUNTIME_ROOT / RUNTIME_SUBDIRECTORY /       ``--envoy-config ROOT/SUB/APPDIR``
RUNTIME_APPDIRECTORY (``config``)           (a directory, watched)
MERGE_DOMAIN_CONFIG                         ``--envoy-merge-domains``
STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT     ``--envoy-stop-counting-when-over``
NEAR_LIMIT_RATIO                            ``--near-limit-ratio``
SHADOW_MODE / QUOTA_MODE                    ``--envoy-shadow-mode`` / ``--envoy-quota-mode``
RESPONSE_DYNAMIC_METADATA                   ``--envoy-dynamic-metadata``
REDIS_URL (+ REDIS_SOCKET_TYPE,             ``--store redis://...`` (``rediss://``
REDIS_AUTH, REDIS_TLS, REDIS_TYPE)          with TLS, ``redis+cluster://``, ...)
GRPC_HOST / GRPC_PORT                       ``--grpc HOST:PORT``
HOST / PORT                                 ``--http HOST:PORT``
LOG_LEVEL                                   ``--log-level``
==========================================  =====================================

Only with ``--envoy-env``: names such as PORT and REDIS_URL are too common to
read unasked. A flag given on the command line wins over its variable.

Reloading the envoy configuration when its files change, as envoyproxy/
ratelimit watches its runtime directory: every ``interval`` seconds the files'
`fingerprint` is taken (names, and through symlinks their identity, size and
time), and a change loads them all again. A bad file is logged and counted,
and the configuration in force stays, as for a reload by hand.

Polling, not inotify: it needs no native dependency, costs a few ``stat`` calls
a second, and sees a Kubernetes ConfigMap's ``..data`` symlink swap, which
changes no watched name.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..primitives import ConfigurationError
from ._files import fingerprint

__all__ = [
    "EnvoyOptions",
    "EnvoyWatcher",
    "add_arguments",
    "apply_environment",
    "envoy_options",
]


@dataclass(frozen=True)
class EnvoyOptions:
    """How envoy domains are served (see `ratewarden.rules.EnvoyConfig`)."""

    merge: bool = False
    count_denied: bool = True
    near_limit_ratio: float = 0.8
    shadow_mode: bool = False
    quota_mode: bool = False
    reload_interval: float = 1.0  # seconds between looks at the files; 0: never
    dynamic_metadata: bool = False  # RESPONSE_DYNAMIC_METADATA (`shown`)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--envoy-merge-domains", action="store_true",
        help="several envoy config files may name one domain (MERGE_DOMAIN_CONFIG)")  # fmt: skip
    add("--envoy-stop-counting-when-over", action="store_true",
        help="count an envoy domain's request only if admitted, in all its limits at once "
        "(STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT); by default every request counts")  # fmt: skip
    add("--near-limit-ratio", type=float, default=0.8, metavar="RATIO",
        help="envoy limits' near_limit statistic counts from this share (0.8)")  # fmt: skip
    add("--envoy-shadow-mode", action="store_true",
        help="envoy domains never deny; their statistics still count (SHADOW_MODE)")  # fmt: skip
    add("--envoy-quota-mode", action="store_true",
        help="every envoy limit is a quota_mode limit (QUOTA_MODE)")  # fmt: skip
    add("--envoy-reload-interval", type=float, default=1.0, metavar="SECONDS",
        help="look for changed envoy config files this often (default 1; 0: only on "
        "SIGHUP and /v1/reload)")  # fmt: skip
    add("--envoy-dynamic-metadata", action="store_true",
        help="answer envoy domains with the request and its limits' metadata as dynamic "
        "metadata (RESPONSE_DYNAMIC_METADATA)")  # fmt: skip
    add("--envoy-env", action="store_true",
        help="read envoyproxy/ratelimit's environment variables (RUNTIME_ROOT, REDIS_URL, "
        "...) where they map; flags win")  # fmt: skip


def envoy_options(args: argparse.Namespace) -> EnvoyOptions:
    ratio = args.near_limit_ratio
    if not 0 <= ratio <= 1:
        raise ConfigurationError(f"--near-limit-ratio must be from 0 to 1, got {ratio}")
    if args.envoy_reload_interval < 0:
        raise ConfigurationError("--envoy-reload-interval must be >= 0 seconds")
    return EnvoyOptions(
        merge=args.envoy_merge_domains,
        count_denied=not args.envoy_stop_counting_when_over,
        near_limit_ratio=ratio,
        shadow_mode=args.envoy_shadow_mode,
        quota_mode=args.envoy_quota_mode,
        reload_interval=args.envoy_reload_interval,
        dynamic_metadata=args.envoy_dynamic_metadata,
    )


def _flag(environ: Mapping[str, str], name: str) -> bool | None:
    raw = environ.get(name)
    if raw is None or raw == "":
        return None
    lowered = raw.strip().lower()
    if lowered in ("1", "t", "true", "yes", "on"):
        return True
    if lowered in ("0", "f", "false", "no", "off"):
        return False
    raise ConfigurationError(f"${name}={raw!r} is not a boolean")


def apply_environment(
    args: argparse.Namespace, defaults: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> None:
    """Fill ``args`` from the peer's variables, where a flag left its default."""

    def unset(name: str) -> bool:
        return bool(getattr(args, name) == getattr(defaults, name))

    root = environ.get("RUNTIME_ROOT")
    if root and not args.envoy_config:
        sub = environ.get("RUNTIME_SUBDIRECTORY", "")
        app = environ.get("RUNTIME_APPDIRECTORY", "config")
        args.envoy_config = [str(Path(root) / sub / app)]
    for variable, name in (
        ("MERGE_DOMAIN_CONFIG", "envoy_merge_domains"),
        ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "envoy_stop_counting_when_over"),
        ("SHADOW_MODE", "envoy_shadow_mode"),
        ("QUOTA_MODE", "envoy_quota_mode"),
        ("RESPONSE_DYNAMIC_METADATA", "envoy_dynamic_metadata"),
    ):
        value = _flag(environ, variable)
        if value is not None and unset(name):
            setattr(args, name, value)
    ratio = environ.get("NEAR_LIMIT_RATIO")
    if ratio and unset("near_limit_ratio"):
        try:
            args.near_limit_ratio = float(ratio)
        except ValueError:
            raise ConfigurationError(f"$NEAR_LIMIT_RATIO={ratio!r} is not a number") from None
    if environ.get("REDIS_URL") and unset("store"):
        args.store = _redis_url(environ)
    for host_var, port_var, name in (("GRPC_HOST", "GRPC_PORT", "grpc"), ("HOST", "PORT", "http")):
        if (environ.get(host_var) or environ.get(port_var)) and unset(name):
            default_host, _, default_port = str(getattr(defaults, name)).rpartition(":")
            host = environ.get(host_var) or default_host
            args_port = environ.get(port_var) or default_port
            setattr(args, name, f"{host}:{args_port}")
    level = environ.get("LOG_LEVEL", "").lower()
    if level and unset("log_level"):
        levels = {"debug": "debug", "trace": "debug", "info": "info", "warn": "warning",
                  "warning": "warning", "error": "error", "fatal": "error",
                  "panic": "error"}  # fmt: skip
        if level not in levels:
            raise ConfigurationError(f"$LOG_LEVEL={level!r} is not a log level")
        args.log_level = levels[level]


def _redis_url(environ: Mapping[str, str]) -> str:
    """REDIS_URL in the peer's terms (``host:port``, a socket path, or for
    REDIS_TYPE sentinel/cluster a comma-separated list) as a --store URL."""
    url = environ["REDIS_URL"]
    if "://" in url:
        return url
    kind = environ.get("REDIS_TYPE", "single").lower()
    auth = environ.get("REDIS_AUTH", "")
    tls = _flag(environ, "REDIS_TLS")
    user = f":{auth}@" if auth and ":" not in auth else (f"{auth}@" if auth else "")
    if kind == "cluster":
        return f"redis+cluster://{user}{url}"
    if kind == "sentinel":
        name, _, hosts = url.partition(",")
        return f"redis+sentinel://{user}{hosts}/{name}"
    if kind != "single":
        raise ConfigurationError(f"$REDIS_TYPE={kind!r}: single, sentinel or cluster")
    if environ.get("REDIS_SOCKET_TYPE", "unix").lower() == "unix" and url.startswith("/"):
        return f"unix://{url}"
    return f"{'rediss' if tls else 'redis'}://{user}{url}"


log = logging.getLogger("ratewarden.server")


class Reloadable(Protocol):
    """What the watcher reloads: the service, which knows its envoy files."""

    envoy_files: tuple[Path, ...]

    async def reload_envoy(self) -> None: ...


class EnvoyWatcher:
    def __init__(self, service: Reloadable, interval: float) -> None:
        if not interval > 0:
            raise ConfigurationError(f"interval must be > 0 seconds, got {interval!r}")
        self.service = service
        self.interval = interval
        self.reloads = 0
        self.failures = 0
        self._seen = fingerprint(service.envoy_files)

    async def apoll(self) -> bool | None:
        """Look once: None when nothing changed, else whether the reload took."""
        now = await asyncio.to_thread(fingerprint, self.service.envoy_files)
        if now == self._seen:
            return None
        self._seen = now
        try:
            await self.service.reload_envoy()
        except ConfigurationError as exc:
            self.failures += 1
            log.error("envoy config changed but not reloaded, the previous stays: %s", exc)
            return False
        self.reloads += 1
        return True

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            await self.apoll()

    def __repr__(self) -> str:
        return f"<EnvoyWatcher every {self.interval}s, {self.reloads} reloads>"
