"""The Redis store: every algorithm as a Lua script, one round trip per check.

Install with ``pip install ratewarden[redis]``. The scripts (package data under
``stores/lua/``) mirror the pure Python steps exactly, in integer microseconds (Lua
numbers are doubles, exact below 2^53); they read the Redis server's clock, so
instances with skewed clocks agree. A test may pass a `Clock` instead, whose time
is then sent with every call. Keys expire once their state is full again.

Still to come (see the issue): the asyncio twin with pipelining, Redis Cluster,
multi-tier checks in one call, failure policies.
"""

from __future__ import annotations

import math
from importlib import resources
from typing import Any, Unpack

from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import NoScriptError, RedisClusterException, RedisError
from redis.retry import Retry

import redis

from .._clock import Clock, SystemClock
from .._decision import Decision
from .._errors import ConfigurationError, StoreError, StoreUnavailable
from .._rate import Rate
from ..algorithms import Algorithm, Params
from ._base import BindOptions, Bound
from ._failure import Breaker, fallback
from .memory import check_cost

__all__ = ["RedisStore", "Scripts", "connect"]

INF = math.inf
CLUSTER_SCHEME = "redis+cluster://"
_FAILURES = (RedisError, RedisClusterException)  # the latter is no RedisError


def connect(url: str, timeout: float) -> Any:
    """A client for ``url``: ``redis://``, ``rediss://``, ``unix://``, or
    ``redis+cluster://host:port,host:port`` (any reachable nodes of a cluster).

    Connect and command timeouts are ``timeout``; no retries: a retry with backoff
    would break the decision's time bound, and the breaker does the retrying.
    """
    no_retry = Retry(NoBackoff(), 0)
    try:
        if url.startswith(CLUSTER_SCHEME):
            nodes = []
            for node in url[len(CLUSTER_SCHEME) :].split(","):
                host, _, port = node.strip().rpartition(":")
                if not host or not port.isdigit():
                    raise ValueError(f"expected host:port, got {node!r}")
                nodes.append(ClusterNode(host, int(port)))  # type: ignore[no-untyped-call]
            return RedisCluster(
                startup_nodes=nodes, socket_timeout=timeout, socket_connect_timeout=timeout,
                retry=no_retry,
            )  # fmt: skip
        return redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=no_retry
        )
    except ValueError as exc:
        raise ConfigurationError(f"bad Redis URL {url!r}: {exc}") from exc
    except _FAILURES as exc:
        raise StoreUnavailable(f"redis: cannot reach {url!r}: {exc}") from exc


def _source(name: str) -> str:
    lua = resources.files("ratewarden.stores") / "lua"
    return "\n".join((lua / f"{part}.lua").read_text() for part in ("_prelude", name, "_epilogue"))


class Scripts:
    """The algorithm scripts of one client: loaded once, called by SHA, reloaded on
    NOSCRIPT (after a server restart or SCRIPT FLUSH)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._sources: dict[str, str] = {}
        self._shas: dict[str, str] = {}

    def call(self, algorithm: Algorithm, key: str, args: list[int | str]) -> list[int]:
        name = algorithm.step.__name__
        sha = self._shas.get(name)
        try:
            if sha is not None:
                try:
                    return self.client.evalsha(sha, 1, key, *args)  # type: ignore[no-any-return]
                except NoScriptError:
                    pass
            source = self._sources.get(name) or self._sources.setdefault(name, _source(name))
            self._shas[name] = self.client.script_load(source)
            return self.client.evalsha(self._shas[name], 1, key, *args)  # type: ignore[no-any-return]
        except _FAILURES as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc


def script_args(params: Params, now_us: int | None, cost: int, mode: str) -> list[int | str]:
    return [
        "" if now_us is None else now_us, cost, params.limit, params.period, params.burst,
        params.scale, params.unit, params.capacity, params.span, mode,
    ]  # fmt: skip


class RedisStore:
    """A store in Redis or Redis Cluster, from a URL (see `connect`) or an existing
    ``redis.Redis`` / ``redis.RedisCluster`` client. ``clock``: only for tests.

    In a cluster each key lives in its slot; keys that must share one (the tiers of
    one request, later) take a hash tag chosen by the caller: ``"{user-123}:api"``.

    Built from a URL, the client connects and answers within ``timeout`` seconds
    (default 50 ms), which bounds how long a decision can take while Redis is in
    trouble; a client you pass keeps its own settings. A circuit breaker stops
    calling Redis for a moment after repeated failures, so that a down server does
    not cost the timeout on every call, and probes for its return.
    """

    def __init__(self, client: Any, *, timeout: float = 0.05, clock: Clock | None = None) -> None:
        if isinstance(client, str):
            client = connect(client, timeout)
        self.client = client
        self.scripts = Scripts(client)
        self.breaker = Breaker()
        self._test_clock = clock
        self.clock: Clock = SystemClock() if clock is None else clock  # for acquire's waits

    def bind(self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]) -> Bound:
        if rate.period_ns % 1000:
            raise ConfigurationError(
                f"the Redis store counts in microseconds: period {rate.period}s is not whole"
            )
        params = Params.build(
            rate.limit, rate.period_ns // 1000, burst=options["burst"], tick=1e-6,
            rule=options["rule"],
        )  # fmt: skip
        size = params.burst if algorithm.uses_burst else params.limit
        prefix, rule, call = options["prefix"], params.rule, self.scripts.call
        test_clock, breaker, policy = self._test_clock, self.breaker, options["on_failure"]

        def run(key: str, cost: int, mode: str) -> Decision:
            check_cost(cost)
            if breaker.failures and not breaker.allow():
                wait = breaker.retry_after()
                error = StoreUnavailable(f"redis: circuit open, next probe in {wait:.3f}s")
                return fallback(policy, size, rule, wait, error)
            now_us = None if test_clock is None else test_clock.time_ns() // 1000
            try:
                allowed, remaining, reset_us, retry_us = call(
                    algorithm, prefix + key, script_args(params, now_us, cost, mode)
                )
            except StoreError as exc:
                breaker.failed()
                return fallback(policy, size, rule, breaker.retry_after(), exc)
            if breaker.failures:
                breaker.succeeded()
            retry = INF if retry_us < 0 else retry_us * 1e-6
            return Decision(allowed == 1, size, remaining, reset_us * 1e-6, retry, rule)

        def hit(key: str, cost: int = 1) -> Decision:
            return run(key, cost, "hit")

        def peek(key: str, cost: int = 1) -> Decision:
            return run(key, cost, "peek")

        def reset(key: str) -> None:
            try:
                self.client.delete(prefix + key)
            except _FAILURES as exc:
                raise StoreUnavailable(f"redis: {exc}") from exc

        return Bound(hit, peek, reset)

    def __repr__(self) -> str:
        return f"<RedisStore {self.client!r}>"
