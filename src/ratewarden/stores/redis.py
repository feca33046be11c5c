"""The Redis store: every algorithm as a Lua script, one round trip per check.

Install with ``pip install ratewarden[redis]``. The scripts (package data under
``stores/lua/``) mirror the pure Python steps exactly, in integer microseconds (Lua
numbers are doubles, exact below 2^53); they read the Redis server's clock, so
instances with skewed clocks agree. A test may pass a `Clock` instead, whose time
is then sent with every call. Keys expire once their state is full again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import logging
import math
import struct
from collections.abc import Generator, Sequence
from importlib import resources
from typing import Any, TypeAlias, Unpack

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from redis.sentinel import Sentinel

import redis

from .._clock import Clock, SystemClock
from .._decision import Decision
from .._errors import ConfigurationError, StoreError, StoreUnavailable
from .._rate import Rate
from ..algorithms import Algorithm, Params
from ._base import AsyncBound, BindOptions, Bound, Check, check_cost, pick
from ._failure import Breaker, fallback
from ._wire import Unsupported, Wire, usable

__all__ = ["AsyncRedisStore", "RedisStore", "Scripts", "connect"]

INF = math.inf
CLUSTER_SCHEME = "redis+cluster://"
SENTINEL_SCHEME = "redis+sentinel://"
_FAILURES = (RedisError, RedisClusterException)  # the latter is no RedisError

log = logging.getLogger("ratewarden.stores")


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
_QUIET: dict[str, Any] = {
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
        **_QUIET,
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
        raise ConfigurationError(f"bad Redis URL {url!r}: {exc}") from exc
    except _FAILURES as exc:
        raise StoreUnavailable(f"redis: cannot reach {url!r}: {exc}") from exc


# The step functions by the number _many.lua dispatches on.
STEP_IDS = {
    name: number
    for number, name in enumerate(
        ("fixed_window", "sliding_window_counter", "sliding_window_log", "bucket",
         "token_bucket_interval"),
        1,
    )
}  # fmt: skip
MANY, REFUND, BATCH = "_many", "_refund", "_batch"


def _source(name: str) -> str:
    """A script's text: the shared head, then one algorithm and _one.lua (``name``
    is the algorithm's step), every algorithm and _many.lua, or _refund.lua."""
    lua = resources.files("ratewarden.stores") / "lua"

    def read(part: str) -> str:
        return (lua / f"{part}.lua").read_text()

    if name in (MANY, BATCH):
        steps = [f"{read(step)}STEPS[{number}] = step\n" for step, number in STEP_IDS.items()]
        return "\n".join([read("_common"), *steps, read(name)])
    if name == REFUND:
        return "\n".join([read("_common"), read(REFUND)])
    return "\n".join([read("_common"), read(name), read("_one")])


def _check_raw_replies(client: Any) -> None:
    """The scripts return packed binary state (cross-slot refunds): a client that
    decodes replies as text would fail on them mid-request."""
    get_encoder = getattr(client, "get_encoder", None)
    encoder = get_encoder() if callable(get_encoder) else None
    if getattr(encoder, "decode_responses", False):
        raise ConfigurationError(
            "the Redis store needs a client with decode_responses=False (its scripts"
            " exchange binary values); pass a URL or a client without it"
        )


def _sentinels(client: Any) -> list[Any]:
    """The clients of the Sentinels behind a client `connect` made, if any."""
    pool = getattr(client, "connection_pool", None)
    manager = getattr(pool, "sentinel_manager", None)
    return list(getattr(manager, "sentinels", []))


class Scripts:
    """The scripts of one client, by name (an algorithm's step name, `MANY`,
    `REFUND`): called by SHA, computed here rather than asked of the server. On
    NOSCRIPT (first use, or after a server restart or SCRIPT FLUSH) `call` runs
    the script's source, which loads it as it runs; the async store sends SCRIPT
    LOAD ahead of the retried calls in one round trip."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._sources: dict[str, str] = {}
        self._shas: dict[str, str] = {}

    def source(self, name: str) -> str:
        return self._sources.get(name) or self._sources.setdefault(name, _source(name))

    def sha(self, name: str) -> str:
        sha = self._shas.get(name)
        if sha is None:  # Redis names a script by the SHA1 of its text
            text = self.source(name).encode()
            sha = self._shas[name] = hashlib.sha1(text, usedforsecurity=False).hexdigest()
        return sha

    def call(self, name: str, numkeys: int, args: list[Any]) -> Any:
        """EVALSHA script ``name`` with ``args``: its ``numkeys`` keys, then its
        arguments. On NOSCRIPT, EVAL: one round trip more, where SCRIPT LOAD and
        EVALSHA again would be two (each may cost up to the timeout)."""
        try:
            try:
                return self.client.evalsha(self.sha(name), numkeys, *args)
            except NoScriptError:
                return self.client.eval(self.source(name), numkeys, *args)
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


def script_args(key: str, packed: bytes, now_us: int | None, cost: int, mode: str) -> list[Any]:
    """The arguments of an algorithm's script (see _one.lua), its key first."""
    return [key, "" if now_us is None else now_us, cost, packed, mode]


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


_DOUBLE, _PAIR = struct.Struct(">d"), struct.Struct(">dd")


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
        self.script = algorithm.step.__name__
        self.step_id = STEP_IDS[self.script]
        self.packed, self.tick_us = pack(params, tick_us), tick_us
        self.head = struct.pack(">d", self.step_id)
        # _batch.lua's per-check head, by mode
        self.heads = {
            mode: struct.pack(">dd", self.step_id, mode == "peek") for mode in ("hit", "peek")
        }
        self.hz, self.rule = params.hz, params.rule
        self.size = params.burst if algorithm.uses_burst else params.limit
        self.prefix, self.policy = options["prefix"], options["on_failure"]
        self.breaker, self.test_clock = breaker, test_clock
        self.hit: Any = None  # the store's bound hit, for a hit_many of this one tier

    def request(self, key: str, cost: int, mode: str) -> list[Any] | Decision:
        """The script's arguments, or the policy's answer while the breaker is open."""
        check_cost(cost)
        if self.breaker.failures:
            blocked = _blocked([self])
            if blocked is not None:
                return blocked
        clock = self.test_clock
        now_us = None if clock is None else clock.time_ns() // 1000
        return script_args(self.prefix + key, self.packed, now_us, cost, mode)

    def batched(self, key: str, cost: int, mode: str) -> list[Any] | Decision:
        """As `request`, for _batch.lua: the key and the check's 12 doubles."""
        check_cost(cost)
        if self.breaker.failures:
            blocked = _blocked([self])
            if blocked is not None:
                return blocked
        clock = self.test_clock
        now_us = -1 if clock is None else clock.time_ns() // 1000
        # a cost past 2^53 is denied all the same, and would not pack as a double
        packed_cost = _PAIR.pack(min(cost, EXACT), now_us)
        return [self.prefix + key, self.heads[mode] + packed_cost + self.packed]

    def answer(self, result: list[int]) -> Decision:
        if self.breaker.failures:
            self.breaker.succeeded()
        allowed, remaining, reset, retry = result
        hz = self.hz
        return Decision(
            allowed == 1, self.size, remaining, reset / hz, INF if retry < 0 else retry / hz,
            self.rule,
        )  # fmt: skip

    def failed(self, error: StoreError) -> Decision:
        return _failed([self], error)


def _blocked(limits: Sequence[_Limit]) -> Decision | None:
    """The policies' answer while the (shared) breaker is open, else None."""
    breaker = limits[0].breaker
    if breaker.allow():
        return None
    wait = breaker.retry_after()
    error = StoreUnavailable(f"redis: circuit open, next probe in {wait:.3f}s")
    return pick([fallback(lim.policy, lim.size, lim.rule, wait, error) for lim in limits])


def _failed(limits: Sequence[_Limit], error: StoreError) -> Decision:
    """The policies' answer when the store failed: ``"raise"`` in any tier raises."""
    breaker = limits[0].breaker
    breaker.failed()
    wait = breaker.retry_after()
    return pick([fallback(lim.policy, lim.size, lim.rule, wait, error) for lim in limits])


class _Many:
    """A multi-tier check planned for _many.lua: no I/O, shared by the twins."""

    def __init__(self, checks: Sequence[Check], shadow: Sequence[Check] = ()) -> None:
        if not checks and not shadow:
            raise ConfigurationError("hit_many needs at least one check")
        self.limits: list[_Limit] = []
        self.keys: list[str] = []
        self.tiers: list[bytes] = []  # per tier: step number, cost, the limit's constants
        for limit, key, cost in (*checks, *shadow):
            check_cost(cost)
            self.limits.append(limit)
            self.keys.append(limit.prefix + key)
            # a cost past 2^53 is denied all the same, and would not pack as a double
            self.tiers.append(limit.head + _DOUBLE.pack(min(cost, EXACT)) + limit.packed)
        self.enforced = len(checks)  # the tiers after these are shadow tiers
        self.checks, self.shadow = checks, shadow
        clock = self.limits[0].test_clock
        self.now = "" if clock is None else clock.time_ns() // 1000

    def args(self, tiers: Sequence[int], mode: str) -> list[Any]:
        """_many.lua's keys then arguments, for the tiers numbered ``tiers`` (all of
        them when there are shadow tiers)."""
        args: list[Any] = [self.keys[i] for i in tiers]
        args += (self.now, mode, b"".join([self.tiers[i] for i in tiers]))
        if self.enforced < len(self.keys):
            args.append(self.enforced)
        return args

    def answer(self, tiers: Sequence[int], out: list[Any]) -> tuple[int, Decision]:
        """The tier _many.lua chose (see `pick`) and its Decision."""
        tier: int = tiers[out[0] - 1]
        return tier, self.limits[tier].answer(out[1:5])

    def answers(self, out: list[Any]) -> tuple[Decision | None, Decision | None]:
        """The enforced and the shadow tiers' Decisions from a call of every tier
        (None: no such tiers, or shadow tiers not checked)."""
        everything = range(len(self.keys))
        decision = self.answer(everything, out)[1] if out[0] else None
        shadow = self.answer(everything, out[5:10])[1] if out[5] else None
        return decision, shadow

    def failed(self, error: StoreError) -> tuple[Decision | None, Decision | None]:
        """The enforced tiers' policies answer; shadow tiers report nothing."""
        limits = self.limits[: self.enforced]
        return (_failed(limits, error) if limits else None), None

    def blocked(self) -> tuple[Decision | None, Decision | None] | None:
        limits = self.limits[: self.enforced] or self.limits
        decision = _blocked(limits)
        if decision is None:
            return None
        return (decision if self.enforced else None), None

    def slots(self, keyslot: Any) -> list[list[int]]:
        """The tiers grouped by cluster slot, in order of first appearance."""
        groups: dict[int, list[int]] = {}
        for i, key in enumerate(self.keys):
            groups.setdefault(keyslot(key), []).append(i)
        return list(groups.values())

    def refund_args(self, tiers: Sequence[int], written: list[Any]) -> list[Any]:
        """_refund.lua's keys and arguments from a "keep" call's written triples."""
        tick_of = {self.keys[i]: self.limits[i].tick_us for i in tiers}
        keys = written[0::3]
        args: list[Any] = [*keys, self.now]
        for key, before, wrote in zip(keys, written[1::3], written[2::3], strict=True):
            name = key.decode() if isinstance(key, bytes) else key
            args += (wrote, before, tick_of[name])
        return args


Call: TypeAlias = tuple[str, int, list[Any]]  # script name, numkeys, keys + arguments


Answers: TypeAlias = tuple[Decision | None, Decision | None]  # enforced, shadow


def _plan(many: _Many, keyslot: Any) -> Generator[Call, Any, Answers]:
    """The script calls a multi-tier check makes, written once for both twins: each
    yields a call, is sent its result, and returns the Decisions of the enforced
    and the shadow tiers (httpx's auth flows drive sync and async the same way).
    ``keyslot``: a cluster client's, to group the tiers by slot; None on one node."""
    if many.limits[0].breaker.failures:
        blocked = many.blocked()
        if blocked is not None:
            return blocked
    everything = list(range(len(many.keys)))
    groups = [everything] if keyslot is None else many.slots(keyslot)
    if len(groups) == 1:
        out = yield MANY, len(many.keys), many.args(everything, "hit")
        return many.answers(out)
    if many.shadow:  # across slots: the enforced tiers, then the shadow ones, apart
        decision = None
        if many.checks:
            decision = yield from _part(_Many(many.checks), keyslot)
            if decision is not None and not decision.allowed:
                return decision, None
        return decision, (yield from _part(_Many(many.shadow), keyslot))
    # Across slots: count slot by slot; after a denial only evaluate, then refund
    # the slots that counted (see RedisStore). A store error (thrown in by the
    # driver) after a slot denied still answers that denial; one before any
    # denial refunds what counted, as far as the store lets it, and goes to the
    # policy. A refund that fails leaves its count: deny more, never admit more.
    decisions: list[tuple[int, Decision]] = []
    counted: list[tuple[list[int], list[Any]]] = []
    denied = False
    failure: StoreError | None = None
    for tiers in groups:
        try:
            out = yield MANY, len(tiers), many.args(tiers, "dry" if denied else "keep")
        except StoreError as exc:
            if not denied:
                failure = exc
            break
        decisions.append(many.answer(tiers, out))
        if not decisions[-1][1].allowed:
            denied = True
        elif not denied:
            counted.append((tiers, out[10:]))
    if denied or failure is not None:
        for tiers, written in counted:
            if written:
                with contextlib.suppress(StoreError):
                    yield REFUND, len(written) // 3, many.refund_args(tiers, written)
    if failure is not None:
        raise failure
    decisions.sort(key=lambda tier_decision: tier_decision[0])  # ties go by tier order
    return pick([decision for _, decision in decisions]), None


def _part(many: _Many, keyslot: Any) -> Generator[Call, Any, Decision | None]:
    """One side of a check split across slots, its own policies answering for it."""
    try:
        return (yield from _plan(many, keyslot))[0]
    except StoreError as exc:
        return many.failed(exc)[0]


class RedisStore:
    """A store in Redis, Redis Cluster or a Sentinel-watched Redis, from a URL (see
    `connect`) or an existing ``redis.Redis`` / ``redis.RedisCluster`` client.
    ``clock``: only for tests.

    Built from a URL, the client connects and answers within ``timeout`` seconds
    (default 50 ms) per step, which bounds how long a decision can take while
    Redis is in trouble: a check is one round trip; a new connection adds its
    connect (and AUTH or SELECT if the URL has them), a server that lost its
    scripts one round trip more. (redis-py's sockets time each step, not the
    whole; `AsyncRedisStore` bounds the whole.) A client you pass keeps its own
    settings. A circuit breaker stops calling Redis for a moment after repeated
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

    def __init__(self, client: Any, *, timeout: float = 0.05, clock: Clock | None = None) -> None:
        self._owns_client = isinstance(client, str)
        if isinstance(client, str):
            client = connect(client, timeout)
        _check_raw_replies(client)
        self.client = client
        self.scripts = Scripts(client)
        self.breaker = Breaker()
        self._test_clock = clock
        self.clock: Clock = SystemClock() if clock is None else clock  # for acquire's waits
        self._keyslot = client.keyslot if isinstance(client, RedisCluster) else None

    def bind(self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]) -> Bound:
        limit = _Limit(algorithm, rate, options, self.breaker, self._test_clock)
        call, script = self.scripts.call, limit.script

        def run(key: str, cost: int, mode: str) -> Decision:
            request = limit.request(key, cost, mode)
            if isinstance(request, Decision):
                return request
            try:
                return limit.answer(call(script, 1, request))
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

        limit.hit = hit
        return Bound(hit, peek, reset, limit)

    def hit_many(self, checks: Sequence[Check]) -> Decision:
        if len(checks) == 1:  # one tier: its algorithm's own script, as hit() runs it
            limit, key, cost = checks[0]
            return limit.hit(key, cost)  # type: ignore[no-any-return]
        return self._run(_Many(checks))[0]  # type: ignore[return-value]

    def hit_tiers(self, checks: Sequence[Check], shadow: Sequence[Check]) -> Answers:
        if not shadow:
            return (self.hit_many(checks) if checks else None), None
        return self._run(_Many(checks, shadow))

    def _run(self, many: _Many) -> Answers:
        plan = _plan(many, self._keyslot)
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

    def close(self) -> None:
        """Close the connections, if this store made its client from a URL (a client
        you passed in stays yours to close)."""
        if self._owns_client:
            self.client.close()
            for sentinel in _sentinels(self.client):
                sentinel.close()

    def __enter__(self) -> RedisStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RedisStore {self.client!r}>"


# a check for _Batcher: script, numkeys, arguments, its caller's future, when it came
_Item: TypeAlias = tuple[str, int, list[Any], asyncio.Future[Any], float]
# a cluster node's answer that says the client's map of the cluster may be wrong
_MAP_FAILURES = (RedisConnectionError, RedisTimeoutError, ClusterDownError, SlotNotCoveredError)
# a cluster node's answer that says where to send a command instead (MovedError is an
# AskError), or to send it again
_REDIRECTS = (AskError, TryAgainError)
REDIRECT_ROUNDS = 3  # a stale map's MOVED, then the new owner's ASK, and one spare


async def _move_slot(manager: Any, error: MovedError) -> None:
    """Points ``error``'s slot at its new owner in a cluster client's map, as
    redis-py does on a MOVED: redis-py 8 awaits ``move_slot``, 7.2 to 7.4 call it,
    older ones apply the error at their next lookup of a slot."""
    move = getattr(manager, "move_slot", None)
    if move is None:
        manager._moved_exception = error
        return
    done = move(error)
    if inspect.isawaitable(done):
        await done


class _Batcher:
    """Coalesces concurrent checks into pipelines: every check submitted in one turn
    of the event loop goes out in one round trip (at most ``max_batch`` a time), and
    checks submitted while a pipeline is in flight go in the next. No timer: the
    batching window is the loop's own turn, microseconds. A pipeline goes over the
    store's own connection (``wire``) when it has one, else through redis-py.

    With a ``timeout``, each check is answered or failed within it of its
    submission: a batch must be over by its oldest check's deadline, connecting
    and reloading scripts included, so a check that waited behind a hung batch
    does not then wait a whole timeout more. (The first batch on a cluster
    client first waits for its map of the cluster, under the client's own
    timeouts, as the sync store's constructor does.)

    redis-py's cluster pipeline puts a node's connection error in its
    commands' places and keeps its map of the cluster as it was: after a
    failover it would send to the dead master for good. So after such an error,
    or a batch that ran out of time, the next batch (the breaker's probe) first
    asks the cluster for its map again.

    A cluster node's redirections (a slot migrating: ASK; moved: MOVED) are
    followed here, all of a batch's in one more pipeline (see `_redirect`), not
    by redis-py's pipeline, which follows each alone, one after the other."""

    def __init__(
        self,
        client: Any,
        scripts: Scripts,
        max_batch: int,
        wire: Wire | None,
        timeout: float | None,
    ) -> None:
        self.client, self.scripts, self.max_batch = client, scripts, max_batch
        self.wire = wire  # one server: its own connection, else redis-py's pipelines
        self.timeout = timeout
        self.cluster = isinstance(client, AsyncRedisCluster)
        self.mapped = False  # a cluster client has its first map of the cluster
        self.remap = False  # and must ask for it again
        self.pending: list[_Item] = []
        self.draining = False
        self.drainer: asyncio.Task[None] | None = None

    def submit(self, script: str, numkeys: int, args: list[Any]) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self.pending.append((script, numkeys, args, future, loop.time()))
        if not self.draining:
            self.draining = True
            self.drainer = loop.create_task(self._drain())  # the loop keeps weak ones
        return future

    async def _drain(self) -> None:
        try:
            while self.pending:
                batch = self.pending[: self.max_batch]
                del self.pending[: self.max_batch]
                await self._send(batch)
        finally:
            self.draining = False

    async def _pipeline(
        self, batch: list[_Item], deadline: float | None, load: Sequence[str] = ()
    ) -> list[Any]:
        """One round trip for ``batch``, after SCRIPT LOAD of the scripts named in
        ``load``; its results in the batch's order, an error as an exception in its
        place. Checks submitted as `BATCH` go out together as one call of
        _batch.lua. Over by ``deadline`` (the loop's clock), or TimeoutError."""
        scripts = self.scripts
        sha = scripts.sha
        commands: list[list[Any]] = [["SCRIPT", "LOAD", scripts.source(name)] for name in load]
        merged = []
        for script, numkeys, args, _, _ in batch:
            if script == BATCH:
                merged.append(args)
            else:
                commands.append(["EVALSHA", sha(script), numkeys, *args])
        if merged:
            keys = [args[0] for args in merged]
            checks = b"".join([args[1] for args in merged])
            commands.append(["EVALSHA", sha(BATCH), len(keys), *keys, checks])
        results = None
        if self.wire is not None:
            try:
                results = (await self.wire.call(commands, deadline))[len(load) :]
            except Unsupported as exc:
                log.warning("redis: %s; the checks go through redis-py's pipelines", exc)
                self.wire = None
        if results is None:
            if self.cluster and not self.mapped:
                await self.client.initialize()
                self.mapped = True
            async with asyncio.timeout_at(deadline):
                if self.remap:
                    await self.client.nodes_manager.initialize()
                    self.remap = False
                for name in load:  # to every primary of a cluster, not one node
                    await self.client.script_load(scripts.source(name))
                pipe = self.client.pipeline(transaction=False)
                for command in commands[len(load) :]:
                    # not pipe.evalsha, which redis-py's cluster pipeline refuses (it
                    # routes EVALSHA by its keys all the same)
                    pipe.execute_command(*command)
                if self.cluster:
                    results = await pipe.execute(raise_on_error=False, allow_redirections=False)
                    await self._redirect(commands[len(load) :], results)
                else:
                    results = await pipe.execute(raise_on_error=False)
            if self.cluster and any(isinstance(r, _MAP_FAILURES) for r in results):
                self.remap = True
        if not merged:
            return results
        together, spread, rest, at = results[-1], [], iter(results), 0
        for script, *_ in batch:
            if script != BATCH:
                spread.append(next(rest))
            elif isinstance(together, Exception):
                spread.append(together)
            else:
                spread.append(together[at : at + 4])
                at += 4
        return spread

    async def _redirect(self, commands: list[list[Any]], results: list[Any]) -> None:
        """Sends ``commands`` that a cluster node redirected again, their answers
        put in ``results`` in place: an ASK's (its slot is migrating and the key
        has left) to the node it names, each after an ASKING on the same
        connection; a MOVED's (the slot has moved) to the new owner, once the
        client's map says so; a TRYAGAIN's as it was. A round is one pipeline, to
        every node at once, and a batch has at most `REDIRECT_ROUNDS`; redis-py's
        pipeline would send each alone, one after the other, an ASK's to the old
        owner first: three round trips a check in a row, for as long as the
        migration lasts, which under load outlasted the timeout. An ASK to a node
        the map does not know stays a failure and asks for a new map."""
        client = self.client
        for _ in range(REDIRECT_ROUNDS):
            again = [i for i, result in enumerate(results) if isinstance(result, _REDIRECTS)]
            if not again:
                return
            pipe = client.pipeline(transaction=False)
            sent: list[tuple[int, bool]] = []  # a command's index, and whether ASKING leads it
            moved: set[int] = set()
            for i in again:
                error = results[i]
                if isinstance(error, MovedError):
                    if error.slot_id not in moved:
                        moved.add(error.slot_id)
                        await _move_slot(client.nodes_manager, error)
                    pipe.execute_command(*commands[i])
                    sent.append((i, False))
                elif isinstance(error, AskError):
                    node = client.get_node(host=error.host, port=error.port)
                    if node is None:
                        self.remap = True
                        continue
                    pipe.execute_command("ASKING", target_nodes=node)
                    pipe.execute_command(*commands[i], target_nodes=node)
                    sent.append((i, True))
                else:
                    pipe.execute_command(*commands[i])
                    sent.append((i, False))
            if not sent:
                return
            answers = iter(await pipe.execute(raise_on_error=False, allow_redirections=False))
            for i, asking in sent:
                if asking:
                    next(answers)  # ASKING's OK; had it failed, so did the command
                results[i] = next(answers)

    async def _send(self, batch: list[_Item]) -> None:
        deadline = None if self.timeout is None else batch[0][4] + self.timeout
        try:
            if deadline is not None and asyncio.get_running_loop().time() >= deadline:
                raise TimeoutError  # it waited its whole timeout behind other batches
            results = await self._pipeline(batch, deadline)
            missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
            if missing:  # first use, or the server lost its scripts: load, send again
                scripts = sorted({batch[i][0] for i in missing})
                again = await self._pipeline([batch[i] for i in missing], deadline, scripts)
                for i, result in zip(missing, again, strict=True):
                    results[i] = result
        except TimeoutError as exc:  # the deadline's; redis-py's is a RedisError
            error = StoreUnavailable(f"redis: no answer within the timeout ({self.timeout}s)")
            error.__cause__ = exc
            results = [error] * len(batch)
            self.remap = self.cluster
        except (*_FAILURES, OSError) as exc:
            error = StoreUnavailable(f"redis: {exc}")
            error.__cause__ = exc
            results = [error] * len(batch)
            self.remap = self.cluster
        except BaseException as exc:  # a bug, or the loop shutting down: no caller hangs
            for *_, future, _ in batch:
                if not future.done():
                    future.set_exception(exc) if isinstance(exc, Exception) else future.cancel()
            if isinstance(exc, Exception):
                return  # each caller has it; the drain goes on with the next batch
            raise
        for (*_, future, _), result in zip(batch, results, strict=True):
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
    """The asyncio twin of `RedisStore` (Redis or Redis Cluster): the same
    scripts, limits and failure policy, and concurrent checks coalesced into
    pipelines so that one process is not held to one round trip at a time.
    ``hit_many`` works as `RedisStore`'s does, its script calls in the same
    pipelines. Built from a URL of one server, the store sends them over a
    connection of its own instead of redis-py's pipeline, for a fraction of its
    CPU per round trip (see ``_wire``); `aclose` closes it. Built from a URL, each
    check is answered within ``timeout`` of its call, connecting and reloading
    scripts included (see `_Batcher`)."""

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
        _check_raw_replies(client)
        self.client = client
        self.scripts = Scripts(client)
        self.breaker = Breaker()
        self._test_clock = clock
        self.clock: Clock = SystemClock() if clock is None else clock
        self._keyslot = client.keyslot if isinstance(client, AsyncRedisCluster) else None
        # A client made here from a URL, on one plain server: the checks go over a
        # connection of the store's own (see _wire); a client passed in stays
        # untouched, every command through its own pool.
        wire = Wire(client) if self._owns_client and usable(client) else None
        # the timeout bounds each check only on a client made here (one passed in
        # keeps its own settings)
        deadline = timeout if self._owns_client else None
        self._batcher = _Batcher(client, self.scripts, max_batch, wire, deadline)

    def bind(self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]) -> AsyncBound:
        limit = _Limit(algorithm, rate, options, self.breaker, self._test_clock)
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

        limit.hit = hit
        return AsyncBound(hit, peek, reset, limit)

    async def hit_many(self, checks: Sequence[Check]) -> Decision:
        if len(checks) == 1:  # one tier: its algorithm's own script, as hit() runs it
            limit, key, cost = checks[0]
            return await limit.hit(key, cost)  # type: ignore[no-any-return]
        return (await self._run(_Many(checks)))[0]  # type: ignore[return-value]

    async def hit_tiers(self, checks: Sequence[Check], shadow: Sequence[Check]) -> Answers:
        if not shadow:
            return (await self.hit_many(checks) if checks else None), None
        return await self._run(_Many(checks, shadow))

    async def _run(self, many: _Many) -> Answers:
        plan = _plan(many, self._keyslot)
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

    async def aclose(self) -> None:
        """Close the connections, if this store made its client from a URL."""
        if self._batcher.wire is not None:
            await self._batcher.wire.aclose()
        if self._owns_client:
            await self.client.aclose()
            for sentinel in _sentinels(self.client):
                await sentinel.aclose()

    async def __aenter__(self) -> AsyncRedisStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<AsyncRedisStore {self.client!r}>"
