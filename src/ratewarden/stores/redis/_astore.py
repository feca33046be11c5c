"""The Redis store: every algorithm as a Lua script, one round trip per check.

Install with ``pip install ratewarden[redis]``. The scripts (see ``scripts``)
mirror the pure Python steps exactly; they read the Redis server's clock, so
instances with skewed clocks agree. A test may pass a `Clock` instead, whose time
is then sent with every call. Keys expire once their state is full again.

What a check sends and what its reply means is worked out in `_script_calls`, without I/O;
the stores only make the calls. The asyncio store (`_astore`) is written by
hand, the sync one (`_store`) written from it by scripts/unasync.py.
"""

# unasync: twin _store.py
# unasync: rename redis.asyncio -> redis
# unasync: rename asynchronous=True -> asynchronous=False
# unasync: rename ._async_wire -> ._sync_wire
# unasync: rename ._atwotier_io -> ._twotier_io
# unasync: rename ._aleases -> ._leases
# unasync: rename self._batcher.submit -> self.scripts.call
# unasync: rename self._batcher.wire -> self.scripts.wire

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Unpack

from redis.asyncio.cluster import RedisCluster as ClusterClient

from ...algorithms import Algorithm
from ...primitives import (
    Clock,
    ConfigurationError,
    Decision,
    Rate,
    StoreError,
    StoreUnavailable,
    SystemClock,
)
from ..base import AsyncBound, AsyncHitFn, BindOptions, Check
from ..failure import Breaker, Instances, LocalFallback
from ._aleases import AsyncRedisLeases
from ._async_wire import AsyncWire, usable
from ._atwotier_io import AsyncTwoTier
from ._batcher import Batcher
from ._script_calls import Answers, CalendarLimit, Limit, Many, script_calls
from ._twotier import LocalLimit, TwoTierSettings, two_tier_settings
from .connection import FAILURES, check_raw_replies, connect, sentinels
from .scripts import BATCH, Scripts

__all__ = ["AsyncRedisStore"]


class AsyncRedisStore:
    """A store in Redis, Redis Cluster or a Sentinel-watched Redis, from a URL (see
    `connect`) or an existing client (``redis.asyncio.Redis``,
    ``redis.asyncio.RedisCluster``). ``clock``: only for tests. `RedisStore` and
    its asyncio twin take the same arguments (the asyncio one ``max_batch`` too),
    run the same scripts and answer failures by the same policies.

    Built from a URL, the client connects and answers within ``timeout`` seconds
    (default 50 ms), which bounds how long a decision can take while Redis is in
    trouble. `RedisStore` bounds each step: a check is one round trip; a new
    connection adds its connect (and AUTH or SELECT if the URL has them), a server
    that lost its scripts one round trip more. (A round trip is timed as a whole on
    one server, where the scripts go over connections of the store's own, see
    ``_sync_wire``; redis-py's sockets, elsewhere, time each read.) The asyncio
    twin answers each check within ``timeout`` of its call, connecting and
    reloading scripts included, and coalesces concurrent checks into pipelines of
    at most ``max_batch`` (see `Batcher`), so that one process is not held to one
    round trip at a time; on one server it sends them over a connection of its
    own instead of redis-py's pipeline, for a fraction of its CPU per round trip
    (see ``_async_wire``). A client you pass keeps its own settings and carries every
    command itself. A circuit breaker stops calling Redis for a moment after
    repeated failures, so that a down server does not cost the timeout on every
    call, and probes for its return.

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

    calendars = True  # counts calendar periods by the server's clock (see CalendarLimit)

    def __init__(
        self,
        client: Any,
        *,
        timeout: float = 0.05,
        clock: Clock | None = None,
        # unasync: async
        max_batch: int = 128,
        # unasync: end
        two_tier: TwoTierSettings | None = None,
        instances: Instances = 1,
    ) -> None:
        # unasync: async
        if type(max_batch) is not int or max_batch < 1:
            raise ConfigurationError(f"max_batch must be a positive integer, got {max_batch!r}")
        # unasync: end
        self._owns_client = isinstance(client, str)
        if isinstance(client, str):
            client = connect(client, timeout, asynchronous=True)
        check_raw_replies(client)
        self.client = client
        # A client made here from a URL, on one plain server: the scripts go over
        # connections of the store's own (see _async_wire, _sync_wire); a client passed
        # in stays untouched, every command through its own pool.
        wire = AsyncWire(client) if self._owns_client and usable(client) else None
        # unasync: async
        self.scripts = Scripts(client)
        # the timeout bounds each check only on a client made here (one passed in
        # keeps its own settings)
        deadline = timeout if self._owns_client else None
        self._batcher = Batcher(client, self.scripts, max_batch, wire, deadline)
        # unasync: sync
        # self.scripts = Scripts(client, wire)
        # unasync: end
        self.breaker = Breaker()
        self._test_clock = clock
        self.clock: Clock = SystemClock() if clock is None else clock  # for acquire's waits
        self._keyslot = client.keyslot if isinstance(client, ClusterClient) else None
        self._two_tier = two_tier_settings(two_tier)
        self._fallback = LocalFallback(instances, clock)
        self._local: AsyncTwoTier | None = None  # made by the first two-tier limit

    def bind(self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]) -> AsyncBound:
        if options.get("two_tier"):
            if self._local is None:
                self._local = AsyncTwoTier(
                    self._batcher.submit, self._two_tier, self.breaker, self._test_clock,
                    self._keyslot, fallback=self._fallback,
                )  # fmt: skip
            return self._local.bind(algorithm, rate, options, self.hit_many, self._delete)
        kind = Limit if options.get("calendar") is None else CalendarLimit
        limit = kind(algorithm, rate, options, self.breaker, self._test_clock)
        if options["on_failure"] == "local_fallback":
            limit.local = self._fallback.share(algorithm, rate, options)
        call = self._batcher.submit
        # unasync: async
        # One node: the checks of a loop turn go out as one _batch.lua call. A
        # cluster's keys span slots, which one script call cannot: one call each.
        prepare, script = (
            (limit.batched, BATCH) if self._keyslot is None else (limit.request, limit.script)
        )
        # unasync: sync
        # prepare, script = limit.request, limit.script
        # unasync: end

        # hit and peek are each one function, not a call of a shared one: a call
        # less per check, on the store's busiest path
        def checker(mode: str) -> AsyncHitFn:
            async def check(key: str, cost: int = 1) -> Decision:
                request = prepare(key, cost, mode)
                if isinstance(request, Decision):
                    return request
                try:
                    return limit.answer(await call(script, 1, request))
                except StoreError as exc:
                    return limit.failed(exc, key, cost, mode)

            return check

        hit, peek = checker("hit"), checker("peek")

        async def reset(key: str) -> None:
            await self._delete(limit.prefix + key)

        limit.hit = hit
        return AsyncBound(hit, peek, reset, limit)

    async def hit_many(self, checks: Sequence[Check]) -> Decision:
        if self._local is not None and any(type(c[0]) is LocalLimit for c in checks):
            return await self._local.hit_many(checks, self.hit_many)
        if len(checks) == 1:  # one tier: its algorithm's own script, as hit() runs it
            limit, key, cost = checks[0]
            return await limit.hit(key, cost)  # type: ignore[no-any-return]
        decision, _ = await self._run(Many(checks))
        return decision  # type: ignore[return-value]

    async def hit_tiers(self, checks: Sequence[Check], shadow: Sequence[Check]) -> Answers:
        if self._local is not None and any(type(c[0]) is LocalLimit for c in (*checks, *shadow)):
            # the enforced tiers, then the shadow ones apart, as across cluster slots
            decision = await self.hit_many(checks) if checks else None
            if not shadow or (decision is not None and not decision.allowed):
                return decision, None
            return decision, await self.hit_many(shadow)
        if not shadow:
            return (await self.hit_many(checks) if checks else None), None
        return await self._run(Many(checks, shadow))

    async def _run(self, many: Many) -> Answers:
        calls = script_calls(many, self._keyslot)
        call = self._batcher.submit
        try:
            request = next(calls)
            while True:
                try:
                    result = await call(*request)
                except StoreError as exc:  # the calls decide what a failure means
                    request = calls.throw(exc)
                else:
                    request = calls.send(result)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        except StoreError as exc:
            return many.failed(exc)

    def leases(self) -> AsyncRedisLeases:
        """The lease table of `ratewarden.AsyncConcurrencyLimiter` on this store."""
        return AsyncRedisLeases(self._batcher.submit, self._test_clock)

    async def _delete(self, key: str) -> None:
        """DEL through the client (a reset is rare: no script, no pipeline)."""
        try:
            await self.client.delete(key)
        except (*FAILURES, OSError) as exc:  # a socket's own (asyncio's timeout is one)
            raise StoreUnavailable(f"redis: {exc}") from exc

    async def aclose(self) -> None:
        """Close the connections, if this store made its client from a URL (a client
        you passed in stays yours to close), after a last sync of the two-tier
        limits' hits."""
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
