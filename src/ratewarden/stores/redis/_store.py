"""The Redis store: every algorithm as a Lua script, one round trip per check.

Install with ``pip install ratewarden[redis]``. The scripts (see ``_scripts``)
mirror the pure Python steps exactly; they read the Redis server's clock, so
instances with skewed clocks agree. A test may pass a `Clock` instead, whose time
is then sent with every call. Keys expire once their state is full again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Unpack

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from ..._clock import Clock, SystemClock
from ..._decision import Decision
from ..._errors import ConfigurationError, StoreError, StoreUnavailable
from ..._rate import Rate
from ...algorithms import Algorithm
from ..base import AsyncBound, BindOptions, Bound, Check
from ..failure import Breaker, Instances, LocalFallback
from ._atwotier_io import AsyncTwoTier
from ._batcher import Batcher
from ._plan import Answers, Limit, Many, plan_calls
from ._syncwire import Wire
from ._syncwire import usable as sync_usable
from ._twotier import LocalLimit, TwoTierSettings
from ._twotier_io import TwoTier
from ._wire import AsyncWire, usable
from .connection import FAILURES, check_raw_replies, connect, sentinels
from .scripts import BATCH, Scripts

__all__ = ["AsyncRedisStore", "RedisStore", "Scripts", "TwoTierSettings", "connect"]


def _settings(two_tier: object) -> TwoTierSettings:
    if two_tier is None:
        return TwoTierSettings()
    if not isinstance(two_tier, TwoTierSettings):
        raise ConfigurationError(
            f"two_tier takes TwoTierSettings(...), got {two_tier!r}; a limit counts in two"
            " tiers when it is bound with two_tier=True (Limiter(..., two_tier=True))"
        )
    return two_tier


class RedisStore:
    """A store in Redis, Redis Cluster or a Sentinel-watched Redis, from a URL (see
    `connect`) or an existing ``redis.Redis`` / ``redis.RedisCluster`` client.
    ``clock``: only for tests.

    Built from a URL, the client connects and answers within ``timeout`` seconds
    (default 50 ms) per step, which bounds how long a decision can take while
    Redis is in trouble: a check is one round trip; a new connection adds its
    connect (and AUTH or SELECT if the URL has them), a server that lost its
    scripts one round trip more. (A round trip is timed as a whole on one server,
    where the scripts go over connections of the store's own, see ``_syncwire``;
    redis-py's sockets, elsewhere, time each read; `AsyncRedisStore` bounds the
    whole check.) A client you pass keeps its own settings and carries every
    command itself. A circuit breaker stops calling Redis for a moment after repeated
    failures, so that a down server does not cost the timeout on every call, and
    probes for its return.

    ``hit_many`` runs every tier of a request in one script call, atomically, when
    their keys share a cluster slot (always on a single Redis; in a cluster, give
    the keys one hash tag: ``"{user-123}:minute"``, ``"{user-123}:day"``). Tiers
    that span slots take one call per slot, in order: a slot whose tiers all pass
    counts them and remembers what it wrote; after a denial the remaining slots are
    only evaluated, and the slots that counted are refunded, each key restored to
    its earlier value unless another request has counted on it in between (then it
    keeps the count: a refund can only deny more, never admit more). Between the
    count and the refund, other requests see the tiers counted; so across slots a
    denied request can briefly cost others capacity, and two racing requests can
    both be denied where one would have passed.
    """

    def __init__(
        self,
        client: Any,
        *,
        timeout: float = 0.05,
        clock: Clock | None = None,
        two_tier: TwoTierSettings | None = None,
        instances: Instances = 1,
    ) -> None:
        self._owns_client = isinstance(client, str)
        if isinstance(client, str):
            client = connect(client, timeout)
        check_raw_replies(client)
        self.client = client
        # A client made here from a URL, on one plain server: the scripts go over
        # connections of the store's own (see _syncwire); a client passed in stays
        # untouched, every command through its own pool.
        wire = Wire(client) if self._owns_client and sync_usable(client) else None
        self.scripts = Scripts(client, wire)
        self.breaker = Breaker()
        self._test_clock = clock
        self.clock: Clock = SystemClock() if clock is None else clock  # for acquire's waits
        self._keyslot = client.keyslot if isinstance(client, RedisCluster) else None
        self._two_tier = _settings(two_tier)
        self._fallback = LocalFallback(instances, clock)
        self._local: TwoTier | None = None  # made by the first two-tier limit

    def bind(self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]) -> Bound:
        if options.get("two_tier"):
            if self._local is None:
                self._local = TwoTier(
                    self.scripts.call, self._two_tier, self.breaker, self._test_clock,
                    self._keyslot, fallback=self._fallback,
                )  # fmt: skip
            return self._local.bind(algorithm, rate, options, self.hit_many, self._delete)
        limit = Limit(algorithm, rate, options, self.breaker, self._test_clock)
        if options["on_failure"] == "local_fallback":
            limit.local = self._fallback.share(algorithm, rate, options)
        call, script = self.scripts.call, limit.script

        def run(key: str, cost: int, mode: str) -> Decision:
            request = limit.request(key, cost, mode)
            if isinstance(request, Decision):
                return request
            try:
                return limit.answer(call(script, 1, request))
            except StoreError as exc:
                return limit.failed(exc, key, cost, mode)

        def hit(key: str, cost: int = 1) -> Decision:
            return run(key, cost, "hit")

        def peek(key: str, cost: int = 1) -> Decision:
            return run(key, cost, "peek")

        def reset(key: str) -> None:
            try:
                self.client.delete(limit.prefix + key)
            except (*FAILURES, OSError) as exc:
                raise StoreUnavailable(f"redis: {exc}") from exc

        limit.hit = hit
        return Bound(hit, peek, reset, limit)

    def hit_many(self, checks: Sequence[Check]) -> Decision:
        if self._local is not None and any(type(c[0]) is LocalLimit for c in checks):
            return self._local.hit_many(checks, self.hit_many)
        if len(checks) == 1:  # one tier: its algorithm's own script, as hit() runs it
            limit, key, cost = checks[0]
            return limit.hit(key, cost)  # type: ignore[no-any-return]
        return self._run(Many(checks))[0]  # type: ignore[return-value]

    def hit_tiers(self, checks: Sequence[Check], shadow: Sequence[Check]) -> Answers:
        if self._local is not None and any(type(c[0]) is LocalLimit for c in (*checks, *shadow)):
            # the enforced tiers, then the shadow ones apart, as across cluster slots
            decision = self.hit_many(checks) if checks else None
            if not shadow or (decision is not None and not decision.allowed):
                return decision, None
            return decision, self.hit_many(shadow)
        if not shadow:
            return (self.hit_many(checks) if checks else None), None
        return self._run(Many(checks, shadow))

    def _run(self, many: Many) -> Answers:
        plan = plan_calls(many, self._keyslot)
        call = self.scripts.call
        try:
            request = next(plan)
            while True:
                try:
                    result = call(*request)
                except StoreError as exc:  # the plan decides what a failure means
                    request = plan.throw(exc)
                else:
                    request = plan.send(result)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        except StoreError as exc:
            return many.failed(exc)

    def _delete(self, key: str) -> None:
        try:
            self.client.delete(key)
        except (*FAILURES, OSError) as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc

    def close(self) -> None:
        """Close the connections, if this store made its client from a URL (a client
        you passed in stays yours to close), after a last sync of the two-tier
        limits' hits."""
        if self._local is not None:
            self._local.close()
        if self.scripts.wire is not None:
            self.scripts.wire.close()
        if self._owns_client:
            self.client.close()
            for sentinel in sentinels(self.client):
                sentinel.close()

    def __enter__(self) -> RedisStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RedisStore {self.client!r}>"


class AsyncRedisStore:
    """The asyncio twin of `RedisStore` (Redis or Redis Cluster): the same
    scripts, limits and failure policy, and concurrent checks coalesced into
    pipelines so that one process is not held to one round trip at a time.
    ``hit_many`` works as `RedisStore`'s does, its script calls in the same
    pipelines. Built from a URL of one server, the store sends them over a
    connection of its own instead of redis-py's pipeline, for a fraction of its
    CPU per round trip (see ``_wire``); `aclose` closes it. Built from a URL, each
    check is answered within ``timeout`` of its call, connecting and reloading
    scripts included (see `Batcher`)."""

    def __init__(
        self,
        client: Any,
        *,
        timeout: float = 0.05,
        clock: Clock | None = None,
        max_batch: int = 128,
        two_tier: TwoTierSettings | None = None,
        instances: Instances = 1,
    ) -> None:
        if type(max_batch) is not int or max_batch < 1:
            raise ConfigurationError(f"max_batch must be a positive integer, got {max_batch!r}")
        self._owns_client = isinstance(client, str)
        if isinstance(client, str):
            client = connect(client, timeout, asynchronous=True)
        check_raw_replies(client)
        self.client = client
        self.scripts = Scripts(client)
        self.breaker = Breaker()
        self._test_clock = clock
        self.clock: Clock = SystemClock() if clock is None else clock
        self._keyslot = client.keyslot if isinstance(client, AsyncRedisCluster) else None
        self._two_tier = _settings(two_tier)
        self._fallback = LocalFallback(instances, clock)
        self._local: AsyncTwoTier | None = None  # made by the first two-tier limit
        # A client made here from a URL, on one plain server: the checks go over a
        # connection of the store's own (see _wire); a client passed in stays
        # untouched, every command through its own pool.
        wire = AsyncWire(client) if self._owns_client and usable(client) else None
        # the timeout bounds each check only on a client made here (one passed in
        # keeps its own settings)
        deadline = timeout if self._owns_client else None
        self._batcher = Batcher(client, self.scripts, max_batch, wire, deadline)

    def bind(self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]) -> AsyncBound:
        if options.get("two_tier"):
            if self._local is None:
                self._local = AsyncTwoTier(
                    self._batcher.submit, self._two_tier, self.breaker, self._test_clock,
                    self._keyslot, fallback=self._fallback,
                )  # fmt: skip
            return self._local.bind(algorithm, rate, options, self.hit_many, self._delete)
        limit = Limit(algorithm, rate, options, self.breaker, self._test_clock)
        if options["on_failure"] == "local_fallback":
            limit.local = self._fallback.share(algorithm, rate, options)
        submit = self._batcher.submit
        # One node: the checks of a loop turn go out as one _batch.lua call. A
        # cluster's keys span slots, which one script call cannot: one call each.
        prepare, script = (
            (limit.batched, BATCH) if self._keyslot is None else (limit.request, limit.script)
        )

        async def run(key: str, cost: int, mode: str) -> Decision:
            request = prepare(key, cost, mode)
            if isinstance(request, Decision):
                return request
            try:
                return limit.answer(await submit(script, 1, request))
            except StoreError as exc:
                return limit.failed(exc, key, cost, mode)

        async def hit(key: str, cost: int = 1) -> Decision:
            return await run(key, cost, "hit")

        async def peek(key: str, cost: int = 1) -> Decision:
            return await run(key, cost, "peek")

        async def reset(key: str) -> None:
            try:
                await self.client.delete(limit.prefix + key)
            except (*FAILURES, OSError) as exc:
                raise StoreUnavailable(f"redis: {exc}") from exc

        limit.hit = hit
        return AsyncBound(hit, peek, reset, limit)

    async def hit_many(self, checks: Sequence[Check]) -> Decision:
        if self._local is not None and any(type(c[0]) is LocalLimit for c in checks):
            return await self._local.hit_many(checks, self.hit_many)
        if len(checks) == 1:  # one tier: its algorithm's own script, as hit() runs it
            limit, key, cost = checks[0]
            return await limit.hit(key, cost)  # type: ignore[no-any-return]
        return (await self._run(Many(checks)))[0]  # type: ignore[return-value]

    async def hit_tiers(self, checks: Sequence[Check], shadow: Sequence[Check]) -> Answers:
        if self._local is not None and any(type(c[0]) is LocalLimit for c in (*checks, *shadow)):
            decision = await self.hit_many(checks) if checks else None
            if not shadow or (decision is not None and not decision.allowed):
                return decision, None
            return decision, await self.hit_many(shadow)
        if not shadow:
            return (await self.hit_many(checks) if checks else None), None
        return await self._run(Many(checks, shadow))

    async def _run(self, many: Many) -> Answers:
        plan = plan_calls(many, self._keyslot)
        submit = self._batcher.submit
        try:
            request = next(plan)
            while True:
                try:
                    result = await submit(*request)
                except StoreError as exc:  # the plan decides what a failure means
                    request = plan.throw(exc)
                else:
                    request = plan.send(result)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        except StoreError as exc:
            return many.failed(exc)

    async def _delete(self, key: str) -> None:
        try:
            await self.client.delete(key)
        except (*FAILURES, OSError) as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc

    async def aclose(self) -> None:
        """Close the connections, if this store made its client from a URL, after a
        last sync of the two-tier limits' hits."""
        if self._local is not None:
            await self._local.aclose()
        if self._batcher.wire is not None:
            await self._batcher.wire.aclose()
        if self._owns_client:
            await self.client.aclose()
            for sentinel in sentinels(self.client):
                await sentinel.aclose()

    async def __aenter__(self) -> AsyncRedisStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<AsyncRedisStore {self.client!r}>"
