# Generated from src/ratewarden/stores/redis/_astore.py by scripts/unasync.py:
# edit that file, then run the script.
"""The Redis store: every algorithm as a Lua script, one round trip per check.

Install with ``pip install ratewarden[redis]``. The scripts (see ``scripts``)
mirror the pure Python steps exactly; they read the Redis server's clock, so
instances with skewed clocks agree. A test may pass a `Clock` instead, whose time
is then sent with every call. Keys expire once their state is full again.

What a check sends and what its reply means is worked out in `_script_calls`, without I/O;
the stores only make the calls. The asyncio store (`_astore`) is written by
hand, the sync one (`_store`) written from it by scripts/unasync.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Unpack

from redis.cluster import RedisCluster as ClusterClient

from ...algorithms import Algorithm
from ...primitives import (
    Clock,
    Decision,
    Rate,
    StoreError,
    StoreUnavailable,
    SystemClock,
)
from ..base import BindOptions, Bound, Check, HitFn
from ..failure import Breaker, Instances, LocalFallback
from ._leases import RedisLeases
from ._script_calls import Answers, CalendarLimit, Limit, Many, script_calls
from ._sync_wire import Wire, usable
from ._twotier import LocalLimit, TwoTierSettings, two_tier_settings
from ._twotier_io import TwoTier
from .connection import FAILURES, check_raw_replies, connect, sentinels
from .scripts import Scripts

__all__ = ["RedisStore"]


class RedisStore:
    """A store in Redis, Redis Cluster or a Sentinel-watched Redis, from a URL (see
    `connect`) or an existing client (``redis.Redis``,
    ``redis.RedisCluster``). ``clock``: only for tests. `RedisStore` and
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
        two_tier: TwoTierSettings | None = None,
        instances: Instances = 1,
    ) -> None:
        self._owns_client = isinstance(client, str)
        if isinstance(client, str):
            client = connect(client, timeout, asynchronous=False)
        check_raw_replies(client)
        self.client = client
        # A client made here from a URL, on one plain server: the scripts go over
        # connections of the store's own (see _async_wire, _sync_wire); a client passed
        # in stays untouched, every command through its own pool.
        wire = Wire(client) if self._owns_client and usable(client) else None
        self.scripts = Scripts(client, wire)
        self.breaker = Breaker()
        self._test_clock = clock
        self.clock: Clock = SystemClock() if clock is None else clock  # for acquire's waits
        self._keyslot = client.keyslot if isinstance(client, ClusterClient) else None
        self._two_tier = two_tier_settings(two_tier)
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
        kind = Limit if options.get("calendar") is None else CalendarLimit
        limit = kind(algorithm, rate, options, self.breaker, self._test_clock)
        if options["on_failure"] == "local_fallback":
            limit.local = self._fallback.share(algorithm, rate, options)
        call = self.scripts.call
        prepare, script = limit.request, limit.script

        # hit and peek are each one function, not a call of a shared one: a call
        # less per check, on the store's busiest path
        def checker(mode: str) -> HitFn:
            def check(key: str, cost: int = 1) -> Decision:
                request = prepare(key, cost, mode)
                if isinstance(request, Decision):
                    return request
                try:
                    return limit.answer(call(script, 1, request))
                except StoreError as exc:
                    return limit.failed(exc, key, cost, mode)

            return check

        hit, peek = checker("hit"), checker("peek")

        def reset(key: str) -> None:
            self._delete(limit.prefix + key)

        limit.hit = hit
        return Bound(hit, peek, reset, limit)

    def hit_many(self, checks: Sequence[Check]) -> Decision:
        if self._local is not None and any(type(c[0]) is LocalLimit for c in checks):
            return self._local.hit_many(checks, self.hit_many)
        if len(checks) == 1:  # one tier: its algorithm's own script, as hit() runs it
            limit, key, cost = checks[0]
            return limit.hit(key, cost)  # type: ignore[no-any-return]
        decision, _ = self._run(Many(checks))
        return decision  # type: ignore[return-value]

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
        calls = script_calls(many, self._keyslot)
        call = self.scripts.call
        try:
            request = next(calls)
            while True:
                try:
                    result = call(*request)
                except StoreError as exc:  # the calls decide what a failure means
                    request = calls.throw(exc)
                else:
                    request = calls.send(result)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        except StoreError as exc:
            return many.failed(exc)

    def leases(self) -> RedisLeases:
        """The lease table of `ratewarden.ConcurrencyLimiter` on this store."""
        return RedisLeases(self.scripts.call, self._test_clock)

    def _delete(self, key: str) -> None:
        """DEL through the client (a reset is rare: no script, no pipeline)."""
        try:
            self.client.delete(key)
        except (*FAILURES, OSError) as exc:  # a socket's own (asyncio's timeout is one)
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
