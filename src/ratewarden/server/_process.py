"""The process ``ratewarden serve`` runs in: its open-file limit fitted to the
listeners, the event loop (uvloop when installed), and with ``--workers`` the
forked processes that share the HTTP socket and the gRPC port (`_workers`).

Both listeners take one `ConnectionLimits` (``--max-connections``, the timeouts,
``--max-header-bytes``), and the process's file-descriptor limit is raised to
fit them: a listener that may hold ten thousand connections is no use to a
process that may open a thousand files.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import socket
from dataclasses import replace
from typing import Any

from ..primitives import ConfigurationError
from ._addresses import bind
from ._connection_limits import ConnectionLimits
from ._logging import setup_logging
from ._serve import serve
from ._serve_options import DEFAULT_LIMITS, ServeOptions, check_options
from ._workers import Ready, supervise

__all__ = ["SPARE_DESCRIPTORS", "fit_descriptors", "run"]

log = logging.getLogger("ratewarden.server")

# Descriptors kept beside the listeners' connections: the store's sockets, the
# listening sockets, the event loop's, logs, the rule file being reloaded.
SPARE_DESCRIPTORS = 256


def fit_descriptors(limits: ConnectionLimits, listeners: int) -> ConnectionLimits:
    """Raise the soft limit on open files (RLIMIT_NOFILE) to the hard one, and
    lower ``max_connections``, with a warning, if the listeners' connections
    and `SPARE_DESCRIPTORS` do not fit under it even then: a listener that
    runs out of descriptors refuses everyone, the other listener and the
    store's sockets with it, where one at its cap refuses only the newcomers."""
    try:
        import resource  # noqa: PLC0415 - POSIX only
    except ImportError:  # not POSIX
        return limits
    need = listeners * limits.max_connections + SPARE_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinite = resource.RLIM_INFINITY
    if soft != infinite and (hard == infinite or soft < hard):
        want = max(soft, need) if hard == infinite else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, want, exc)
    if soft == infinite or need <= soft:
        return limits
    fitted = (soft - SPARE_DESCRIPTORS) // listeners
    if fitted < 1:
        raise ConfigurationError(
            f"the process may open only {soft} files (ulimit -n): too few to serve; "
            f"raise it to {need} or more"
        )
    # A number asked for and lowered is a warning. The default fitted to the
    # machine is how the default works: worth a line only when it leaves less
    # than half of itself (10000 to 9872 under a 20000-file limit is no news).
    default = limits.max_connections == DEFAULT_LIMITS.max_connections
    if not default:
        level = logging.WARNING
    else:
        level = logging.INFO if fitted < limits.max_connections // 2 else logging.DEBUG
    log.log(
        level,
        "%s lowered from %d to %d a listener: the process may open %d files "
        "(ulimit -n; the hard limit is %s) and keeps %d for the store, logs and rules",
        "the default --max-connections" if default else "--max-connections",
        limits.max_connections, fitted, soft, "unlimited" if hard == infinite else hard,
        SPARE_DESCRIPTORS,
    )  # fmt: skip
    return replace(limits, max_connections=fitted)


def _worker(options: ServeOptions, http_socket: socket.socket | None, ready: Ready) -> None:
    setup_logging(options.log_format, options.log_level, _secrets(options))
    _run_loop(options, http_socket, ready)


def _secrets(options: ServeOptions) -> tuple[str, ...]:
    return () if options.token is None else (options.token,)


def _run_loop(
    options: ServeOptions, http_socket: socket.socket | None, ready: Ready | None = None
) -> None:
    try:
        import uvloop  # noqa: PLC0415 - optional speed-up

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    runner(serve(options, http_socket, ready))


def run(options: ServeOptions) -> int:
    """Serve in this process, or in ``options.workers`` forked ones sharing the
    HTTP socket (and the gRPC port, through SO_REUSEPORT)."""
    check_options(options)
    setup_logging(options.log_format, options.log_level, _secrets(options))
    listeners = (options.http is not None) + (options.grpc is not None)
    options = replace(options, limits=fit_descriptors(options.limits, listeners))
    if options.workers == 1:
        _run_loop(options, None)
        return 0
    http_socket = None if options.http is None else bind(options.http)
    # one settle secret for every worker: a token one answered, another settles
    os.environ.setdefault("RATEWARDEN_SETTLE_SECRET", secrets.token_hex(32))
    started = None
    if http_socket is not None:
        host, port = http_socket.getsockname()[:2]
        banner = f"ratewarden: {options.workers} workers, HTTP on http://{host}:{port}"
        started = functools.partial(print, banner, flush=True)
    code = supervise(options.workers, functools.partial(_worker, options, http_socket), started)
    if http_socket is not None:
        http_socket.close()
    return code
