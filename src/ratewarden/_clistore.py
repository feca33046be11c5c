"""``--store URL`` for the commands that count (``check``, ``bench``): the memory
store, or a Redis one that is known to answer before the command starts."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ._clicommon import MISSING, UNREACHABLE, USAGE, CliError
from .stores import MemoryStore, Store

__all__ = ["STORE_HELP", "TIMEOUT", "opened_store", "redact"]

# Seconds a Redis command of the CLI may take: a person waits for the answer, a
# service's per-request bound (50 ms) would fail on a slow link for nothing.
TIMEOUT = 2.0
STORE_HELP = "memory (the default) or a Redis URL: redis://, rediss://, unix://, "
STORE_HELP += "redis+cluster://h:p,h:p, redis+sentinel://h:p/service"


def redact(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        return f"{scheme}://***@{rest.rpartition('@')[2]}"
    return url


@contextmanager
def opened_store(url: str) -> Iterator[Store]:
    """The store ``url`` names, closed after the block. A Redis store answers a
    PING first: a store that cannot be reached is exit code 3 at once, not a
    failure policy's answer to every check."""
    if url in ("memory", "memory://"):
        yield MemoryStore()
        return
    try:
        from .stores._redisconn import FAILURES, SCHEMES  # noqa: PLC0415 - the redis extra
        from .stores.redis import RedisStore  # noqa: PLC0415
    except ImportError:
        raise CliError("--store with Redis needs: pip install 'ratewarden[redis]'",
                       MISSING) from None  # fmt: skip
    if not url.startswith(SCHEMES):
        raise CliError(f"--store takes 'memory' or a Redis URL, got {url!r}", USAGE)
    try:
        store = RedisStore(url, timeout=TIMEOUT)
        store.client.ping()
    except FAILURES as exc:
        raise CliError(f"cannot reach the store {redact(url)}: {exc}", UNREACHABLE) from None
    try:
        yield store
    finally:
        store.close()
