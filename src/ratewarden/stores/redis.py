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
import struct
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


EXACT = 2**53  # Lua numbers are doubles: integers are exact below this
TICKS_US = (1, 1_000, 1_000_000)  # microseconds, milliseconds, seconds


def pack(params: Params, tick_us: int = 1) -> bytes:
    """The limit's constants as the scripts read them: 8 big-endian doubles."""
    return struct.pack(
        ">8d", tick_us, params.limit, params.period, params.burst, params.scale,
        params.unit, params.capacity, params.span,
    )  # fmt: skip


def script_args(packed: bytes, now_us: int | None, cost: int, mode: str) -> list[Any]:
    return ["" if now_us is None else now_us, cost, packed, mode]


def redis_params(rate: Rate, burst: int | None, rule: str | None) -> tuple[Params, int]:
    """The limit in the finest tick (us, ms or s) at which the scripts count exactly:
    every constant, and a window's worth of request-ticks, below 2^53."""
    period_us, odd = divmod(rate.period_ns, 1000)
    if odd:
        raise ConfigurationError(
            f"the Redis store counts in microseconds: period {rate.period}s is not whole"
        )
    for tick_us in TICKS_US:
        if period_us % tick_us:
            continue
        params = Params.build(
            rate.limit, period_us // tick_us, burst=burst, tick=tick_us * 1e-6, rule=rule
        )
        if max(params.span, params.capacity, params.burst * params.period) < EXACT:
            return params, tick_us
    raise ConfigurationError(
        f"{rate} is too large for the Redis store to count exactly (limit x period must"
        " stay below 2^53 seconds)"
    )


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
        self._owns_client = isinstance(client, str)
        if isinstance(client, str):
            client = connect(client, timeout)
        self.client = client
        self.scripts = Scripts(client)
        self.breaker = Breaker()
        self._test_clock = clock
        self.clock: Clock = SystemClock() if clock is None else clock  # for acquire's waits

    def bind(self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]) -> Bound:
        params, tick_us = redis_params(rate, options["burst"], options["rule"])
        packed, tick = pack(params, tick_us), params.tick
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
                allowed, remaining, reset, retry = call(
                    algorithm, prefix + key, script_args(packed, now_us, cost, mode)
                )
            except StoreError as exc:
                breaker.failed()
                return fallback(policy, size, rule, breaker.retry_after(), exc)
            if breaker.failures:
                breaker.succeeded()
            return Decision(
                allowed == 1,
                size,
                remaining,
                reset * tick,
                INF if retry < 0 else retry * tick,
                rule,
            )

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

    def close(self) -> None:
        """Close the connections, if this store made its client from a URL (a client
        you passed in stays yours to close)."""
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> RedisStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RedisStore {self.client!r}>"
