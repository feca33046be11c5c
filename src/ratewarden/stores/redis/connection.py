"""Redis URLs and connections: the one place that turns a URL into a client.

The stores, the fleet quotas, the CLI and the service all connect through
`connect`, so that every client gets the same timeouts, no retries and no
extra round trips on a new connection.
"""

from __future__ import annotations

import inspect
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException, RedisError
from redis.retry import Retry
from redis.sentinel import Sentinel

from ...primitives import ConfigurationError, StoreUnavailable

__all__ = ["FAILURES", "QUIET", "SCHEMES", "check_raw_replies", "connect", "sentinels"]

CLUSTER_SCHEME = "redis+cluster://"
SENTINEL_SCHEME = "redis+sentinel://"
SCHEMES = ("redis://", "rediss://", "unix://", CLUSTER_SCHEME, SENTINEL_SCHEME)
FAILURES = (RedisError, RedisClusterException)  # the latter is no RedisError


def _nodes(hosts: str) -> list[tuple[str, int]]:
    nodes = []
    for node in hosts.split(","):
        host, _, port = node.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"expected host:port, got {node!r}")
        nodes.append((host, int(port)))
    return nodes


# What a new connection says before its first command costs round trips, each
# allowed the whole timeout, on every connection and so after every fault. RESP2:
# no HELLO (and none of the RESP3 extras redis-py 8 then asks for, nor pushes the
# store's own connection could mistake for replies; a URL may still ask for
# ``protocol=3``). No CLIENT SETINFO, which redis-py sends for a label in CLIENT
# LIST (redis-py 7.1 names the switch driver_info, and warns on the older names).
QUIET: dict[str, Any] = {
    "protocol": 2,
    **(
        {"driver_info": None}
        if "driver_info" in inspect.signature(redis.Redis.__init__).parameters
        else {"lib_name": None, "lib_version": None}
    ),
}


def connect(url: str, timeout: float, *, asynchronous: bool = False) -> Any:
    """A client for ``url``: ``redis://``, ``rediss://``, ``unix://``,
    ``redis+cluster://host:port,host:port`` (any reachable nodes of a cluster), or
    ``redis+sentinel://host:port,host:port/service[/db]`` (Sentinels, and the name
    of the master they watch); a ``redis.asyncio`` one if ``asynchronous``.

    Connect and command timeouts are ``timeout``; no retries: a retry with backoff
    would break the decision's time bound, and the breaker does the retrying. A new
    connection makes no round trips but those the URL asks for (AUTH, SELECT).
    """
    if type(timeout) not in (int, float) or not timeout > 0:  # bool is no duration
        raise ConfigurationError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    options: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": AsyncRetry(NoBackoff(), 0) if asynchronous else Retry(NoBackoff(), 0),
        **QUIET,
    }
    try:
        if url.startswith(CLUSTER_SCHEME):
            nodes = _nodes(url[len(CLUSTER_SCHEME) :])
            if asynchronous:
                startup = [AsyncClusterNode(host, port) for host, port in nodes]
                return AsyncRedisCluster(startup_nodes=startup, **options)
            sync_startup = [ClusterNode(h, p) for h, p in nodes]  # type: ignore[no-untyped-call]
            return RedisCluster(startup_nodes=sync_startup, **options)
        if url.startswith(SENTINEL_SCHEME):
            hosts, _, path = url[len(SENTINEL_SCHEME) :].partition("/")
            service, _, db = path.partition("/")
            if not service or (db and not db.isdigit()):
                raise ValueError("expected redis+sentinel://host:port,.../service[/db]")
            watchers = AsyncSentinel if asynchronous else Sentinel
            sentinel = watchers(_nodes(hosts), sentinel_kwargs=dict(options), **options)
            return sentinel.master_for(service, db=int(db or 0))
        if asynchronous:
            return aioredis.Redis.from_url(url, **options)
        return redis.Redis.from_url(url, **options)
    except ValueError as exc:
        said = _hidden(str(exc), url)
        raise ConfigurationError(f"bad Redis URL {_redact(url)!r}: {said}") from exc
    except FAILURES as exc:
        said = _hidden(str(exc), url)
        raise StoreUnavailable(f"redis: cannot reach {_redact(url)!r}: {said}") from exc


def _hidden(text: str, url: str) -> str:
    """``text`` with the credentials of ``url`` replaced by ``***``, so an error
    that quotes the URL, or a part of it, never shows a password: the user part
    before ``@`` and the values of ``password=`` in the query, each matched with
    the ``@`` or ``password=`` around it, never as a bare word that could be
    anywhere in the text."""
    _, sep, rest = url.partition("://")
    if sep and "@" in rest:
        text = text.replace(rest.rpartition("@")[0] + "@", "***@")
    for pair in rest.partition("?")[2].split("&"):
        name, _, value = pair.partition("=")
        if name == "password" and value:
            text = text.replace(f"password={value}", "password=***")
    return text


def _redact(url: str) -> str:
    """``url`` as an error may show it: ``redis://***@host:6379/0``, as the
    service and the CLI print a store's URL."""
    return _hidden(url, url)


def check_raw_replies(client: Any) -> None:
    """The scripts return packed binary state (cross-slot refunds): a client that
    decodes replies as text would fail on them mid-request."""
    get_encoder = getattr(client, "get_encoder", None)
    encoder = get_encoder() if callable(get_encoder) else None
    if getattr(encoder, "decode_responses", False):
        raise ConfigurationError(
            "the Redis store needs a client with decode_responses=False (its scripts"
            " exchange binary values); pass a URL or a client without it"
        )


def sentinels(client: Any) -> list[Any]:
    """The clients of the Sentinels behind a client `connect` made, if any."""
    pool = getattr(client, "connection_pool", None)
    manager = getattr(pool, "sentinel_manager", None)
    return list(getattr(manager, "sentinels", []))
