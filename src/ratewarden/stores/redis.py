"""The Redis store: every algorithm as a Lua script, one round trip per check.

Install with ``pip install ratewarden[redis]``. The scripts (package data under
``stores/lua/``) mirror the pure Python steps exactly, in integer microseconds (Lua
numbers are doubles, exact below 2^53); they read the Redis server's clock, so
instances with skewed clocks agree. A test may pass a `Clock` instead, whose time
is then sent with every call. Keys expire once their state is full again.

Still to come (see the issue): Redis Cluster for the asyncio store, multi-tier
checks in one call.
"""

from __future__ import annotations

import asyncio
import math
import struct
from importlib import resources
from typing import Any, Unpack

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
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
from ._base import AsyncBound, BindOptions, Bound, check_cost
from ._failure import Breaker, fallback

__all__ = ["AsyncRedisStore", "RedisStore", "Scripts", "connect"]

INF = math.inf
CLUSTER_SCHEME = "redis+cluster://"
_FAILURES = (RedisError, RedisClusterException)  # the latter is no RedisError


def connect(url: str, timeout: float, *, asynchronous: bool = False) -> Any:
    """A client for ``url``: ``redis://``, ``rediss://``, ``unix://``, or
    ``redis+cluster://host:port,host:port`` (any reachable nodes of a cluster);
    a ``redis.asyncio`` one if ``asynchronous`` (single Redis only, for now).

    Connect and command timeouts are ``timeout``; no retries: a retry with backoff
    would break the decision's time bound, and the breaker does the retrying.
    """
    if type(timeout) not in (int, float) or not timeout > 0:  # bool is no duration
        raise ConfigurationError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    if asynchronous and url.startswith(CLUSTER_SCHEME):
        raise ConfigurationError("AsyncRedisStore does not speak Redis Cluster yet")
    no_retry = Retry(NoBackoff(), 0)
    try:
        if asynchronous:
            return aioredis.Redis.from_url(
                url, socket_timeout=timeout, socket_connect_timeout=timeout,
                retry=AsyncRetry(NoBackoff(), 0),
            )  # fmt: skip
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

    def source(self, algorithm: Algorithm) -> str:
        name = algorithm.step.__name__
        return self._sources.get(name) or self._sources.setdefault(name, _source(name))

    def sha(self, algorithm: Algorithm) -> str | None:
        return self._shas.get(algorithm.step.__name__)

    def loaded(self, algorithm: Algorithm, sha: str) -> str:
        self._shas[algorithm.step.__name__] = sha
        return sha

    def call(self, algorithm: Algorithm, key: str, args: list[Any]) -> list[int]:
        sha = self.sha(algorithm)
        try:
            if sha is not None:
                try:
                    return self.client.evalsha(sha, 1, key, *args)  # type: ignore[no-any-return]
                except NoScriptError:
                    pass
            sha = self.loaded(algorithm, self.client.script_load(self.source(algorithm)))
            return self.client.evalsha(sha, 1, key, *args)  # type: ignore[no-any-return]
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


class _Limit:
    """One limit bound to Redis: everything about a check except the I/O, shared by
    the sync and async stores."""

    def __init__(
        self,
        algorithm: Algorithm,
        rate: Rate,
        options: BindOptions,
        breaker: Breaker,
        test_clock: Clock | None,
    ) -> None:
        params, tick_us = redis_params(rate, options["burst"], options["rule"])
        self.packed, self.tick, self.rule = pack(params, tick_us), params.tick, params.rule
        self.size = params.burst if algorithm.uses_burst else params.limit
        self.prefix, self.policy = options["prefix"], options["on_failure"]
        self.breaker, self.test_clock = breaker, test_clock

    def request(self, key: str, cost: int, mode: str) -> tuple[str, list[Any]] | Decision:
        """The script call to make, or the policy's answer while the breaker is open."""
        check_cost(cost)
        breaker = self.breaker
        if breaker.failures and not breaker.allow():
            wait = breaker.retry_after()
            error = StoreUnavailable(f"redis: circuit open, next probe in {wait:.3f}s")
            return fallback(self.policy, self.size, self.rule, wait, error)
        clock = self.test_clock
        now_us = None if clock is None else clock.time_ns() // 1000
        return self.prefix + key, script_args(self.packed, now_us, cost, mode)

    def answer(self, result: list[int]) -> Decision:
        if self.breaker.failures:
            self.breaker.succeeded()
        allowed, remaining, reset, retry = result
        tick = self.tick
        return Decision(
            allowed == 1, self.size, remaining, reset * tick, INF if retry < 0 else retry * tick,
            self.rule,
        )  # fmt: skip

    def failed(self, error: StoreError) -> Decision:
        self.breaker.failed()
        return fallback(self.policy, self.size, self.rule, self.breaker.retry_after(), error)


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
        limit = _Limit(algorithm, rate, options, self.breaker, self._test_clock)
        call = self.scripts.call

        def run(key: str, cost: int, mode: str) -> Decision:
            request = limit.request(key, cost, mode)
            if isinstance(request, Decision):
                return request
            try:
                return limit.answer(call(algorithm, *request))
            except StoreError as exc:
                return limit.failed(exc)

        def hit(key: str, cost: int = 1) -> Decision:
            return run(key, cost, "hit")

        def peek(key: str, cost: int = 1) -> Decision:
            return run(key, cost, "peek")

        def reset(key: str) -> None:
            try:
                self.client.delete(limit.prefix + key)
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


class _Batcher:
    """Coalesces concurrent checks into pipelines: every check submitted in one turn
    of the event loop goes out in one round trip (at most ``max_batch`` a time), and
    checks submitted while a pipeline is in flight go in the next. No timer: the
    batching window is the loop's own turn, microseconds."""

    def __init__(self, client: Any, scripts: Scripts, max_batch: int) -> None:
        self.client, self.scripts, self.max_batch = client, scripts, max_batch
        self.pending: list[tuple[Algorithm, str, list[Any], asyncio.Future[list[int]]]] = []
        self.draining = False

    def submit(self, algorithm: Algorithm, key: str, args: list[Any]) -> asyncio.Future[list[int]]:
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self.pending.append((algorithm, key, args, future))
        if not self.draining:
            self.draining = True
            asyncio.get_running_loop().create_task(self._drain())
        return future

    async def _drain(self) -> None:
        try:
            while self.pending:
                batch = self.pending[: self.max_batch]
                del self.pending[: self.max_batch]
                await self._send(batch)
        finally:
            self.draining = False

    async def _pipeline(self, batch: list[tuple[Algorithm, str, list[Any], Any]]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for algorithm, key, args, _ in batch:
            pipe.evalsha(self.scripts.sha(algorithm) or "0" * 40, 1, key, *args)
        return await pipe.execute(raise_on_error=False)  # type: ignore[no-any-return]

    async def _send(self, batch: list[tuple[Algorithm, str, list[Any], Any]]) -> None:
        try:
            results = await self._pipeline(batch)
            missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
            if missing:  # first use, or the server lost its scripts: load, send again
                for algorithm in {batch[i][0] for i in missing}:
                    sha = await self.client.script_load(self.scripts.source(algorithm))
                    self.scripts.loaded(algorithm, sha)
                again = await self._pipeline([batch[i] for i in missing])
                for i, result in zip(missing, again, strict=True):
                    results[i] = result
        except (*_FAILURES, OSError) as exc:
            error = StoreUnavailable(f"redis: {exc}")
            error.__cause__ = exc
            results = [error] * len(batch)
        except BaseException as exc:  # a bug, or the loop shutting down: no caller hangs
            for *_, future in batch:
                if not future.done():
                    future.set_exception(exc) if isinstance(exc, Exception) else future.cancel()
            if isinstance(exc, Exception):
                return  # each caller has it; the drain goes on with the next batch
            raise
        for (*_, future), result in zip(batch, results, strict=True):
            if future.done():  # its caller was cancelled
                continue
            if isinstance(result, StoreError):
                future.set_exception(result)
            elif isinstance(result, Exception):
                error = StoreUnavailable(f"redis: {result}")
                error.__cause__ = result
                future.set_exception(error)
            else:
                future.set_result(result)


class AsyncRedisStore:
    """The asyncio twin of `RedisStore` (single Redis; cluster to come): the same
    scripts, limits and failure policy, and concurrent checks coalesced into
    pipelines so that one process is not held to one round trip at a time."""

    def __init__(
        self,
        client: Any,
        *,
        timeout: float = 0.05,
        clock: Clock | None = None,
        max_batch: int = 128,
    ) -> None:
        if type(max_batch) is not int or max_batch < 1:
            raise ConfigurationError(f"max_batch must be a positive integer, got {max_batch!r}")
        self._owns_client = isinstance(client, str)
        if isinstance(client, str):
            client = connect(client, timeout, asynchronous=True)
        self.client = client
        self.scripts = Scripts(client)
        self.breaker = Breaker()
        self._batcher = _Batcher(client, self.scripts, max_batch)
        self._test_clock = clock
        self.clock: Clock = SystemClock() if clock is None else clock

    def bind(self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]) -> AsyncBound:
        limit = _Limit(algorithm, rate, options, self.breaker, self._test_clock)
        submit = self._batcher.submit

        async def run(key: str, cost: int, mode: str) -> Decision:
            request = limit.request(key, cost, mode)
            if isinstance(request, Decision):
                return request
            try:
                return limit.answer(await submit(algorithm, *request))
            except StoreError as exc:
                return limit.failed(exc)

        async def hit(key: str, cost: int = 1) -> Decision:
            return await run(key, cost, "hit")

        async def peek(key: str, cost: int = 1) -> Decision:
            return await run(key, cost, "peek")

        async def reset(key: str) -> None:
            try:
                await self.client.delete(limit.prefix + key)
            except (*_FAILURES, OSError) as exc:
                raise StoreUnavailable(f"redis: {exc}") from exc

        return AsyncBound(hit, peek, reset)

    async def aclose(self) -> None:
        """Close the connections, if this store made its client from a URL."""
        if self._owns_client:
            await self.client.aclose()

    async def __aenter__(self) -> AsyncRedisStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<AsyncRedisStore {self.client!r}>"
