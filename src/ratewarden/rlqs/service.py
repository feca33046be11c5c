"""The Rate Limit Quota Service's logic, without the wire: each proxy's stream
is a fleet member of every bucket it reports; its reports are its demand, and
its grant goes back as the assignment Envoy enforces (`assignment`).

- A bucket id seen for the first time becomes a fleet resource of its own
  (`config.resource_name`), made from its ``rlqs`` entry's configuration. This
  instance tracks at most ``max_buckets`` of them: past that, the one reported
  least recently is dropped, and the proxies that hold it are told to abandon
  it; one stream holds at most a quarter of them, so that one proxy cannot
  push out everyone else's.
- A proxy's demand is what it allowed and denied since its last report, a
  request a second and a tenth above it for headroom, held from falling faster
  than a fifth a report so that a grant does not waver with the load's noise.
  Its first report of a bucket asks for the whole total: its demand is not yet
  known, and the allocation gives it at most its share; the next one measures
  it.
- A stream that ends keeps its shares until its proxy's last assignments end
  (their time to live, shorter than the lease): the proxy spends them until
  then. Its member then leaves, and the other holders here are rebalanced, so
  that its share moves within the lease; a bucket no stream holds stays tracked
  until its leaves are done (first to go past the bound). An instance that
  dies leaves its members to their leases.
- A bucket a proxy reports without a request for ``abandon_after`` is
  abandoned: the proxy forgets it and the share lapses with the lease.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..fleet.alloc import MILLI, Piece
from ..fleet.coordinator import QuotaStatus, Report
from ..primitives import Clock, ConfigurationError, StoreError, SystemClock
from .assignment import Assignment, assign, steady
from .config import BucketKey, BucketRule, bucket_key, match, resource_name
from .coordinators import Coordinators

log = logging.getLogger("ratewarden.rlqs")

__all__ = [
    "MAX_BUCKETS", "Action", "QuotaService", "QuotaStream", "Stats", "TooManyBuckets", "Usage",
]  # fmt: skip

MAX_BUCKETS = 10_000  # buckets one instance tracks
LEAVE_MARGIN = 0.5  # seconds past a gone proxy's last assignment before its share moves
REBALANCE_AFTER = 0.05  # seconds: joins within it are taken together
REBALANCE_EVERY = 1.0  # seconds: the least time between two rebalances of a bucket
MIN_GAP_MS = 500  # a bucket's reports closer than this make one refresh (Envoy's: 5 s)
ALLOW_TTL = 60  # seconds: a bucket no entry limits, told again at every report
HEADROOM = 1.1  # a proxy's grant above its measured demand
FALL = 0.8  # the most a proxy's wants fall at one report


class TooManyBuckets(ConfigurationError):
    """One stream reported more buckets than it may hold."""


@dataclass(frozen=True, slots=True)
class Usage:
    """One bucket's line of a report."""

    bucket: Mapping[str, str]
    allowed: int
    denied: int


@dataclass(frozen=True, slots=True)
class Action:
    """What a proxy is told for one bucket: an assignment with a time to live
    (None: none), or to abandon the bucket."""

    bucket: BucketKey
    kind: Literal["assign", "abandon"]
    assignment: Assignment | None = None
    ttl: int | None = None  # whole seconds


@dataclass
class Stats:
    """The service's figures, by rule name (never by bucket or proxy)."""

    streams: int = 0
    buckets: int = 0
    evicted: int = 0
    abandoned: int = 0
    unmatched: int = 0
    allowed: dict[str, int] = field(default_factory=dict)
    denied: dict[str, int] = field(default_factory=dict)


@dataclass(eq=False)
class _Bucket:
    key: BucketKey
    domain: str
    resource: str
    rule: BucketRule
    holders: set[QuotaStream] = field(default_factory=set)
    rebalancing: asyncio.Task[None] | None = None
    leaving: int = 0  # members of streams that ended, waiting for their last ttl
    next_rebalance: float = 0.0  # time.monotonic()


@dataclass(eq=False)
class _Held:
    """One stream's part in one bucket."""

    bucket: _Bucket
    last_ms: int
    active_ms: int
    wants: int = 0  # millipermits a window
    has: int = 0
    pieces: tuple[Piece, ...] = ()
    assignment: Assignment | None = None
    used: int = 0
    early_allowed: int = 0  # reported within MIN_GAP_MS of the last refresh
    early_requests: int = 0
    told_ms: int = 0  # when its proxy was last sent an assignment
    short: bool = False  # its grant is short of its share: the others hold the rest
    reported: bool = False
    measured: bool = False  # its wants come from a measured demand


class QuotaService:
    """The buckets of ``rules`` coordinated by ``coordinators``; ``clock`` only
    for tests."""

    def __init__(
        self,
        rules: Sequence[BucketRule],
        coordinators: Coordinators,
        *,
        clock: Clock | None = None,
        max_buckets: int = MAX_BUCKETS,
        instance: str | None = None,
    ) -> None:
        self.rules = tuple(rules)
        self.coordinators = coordinators
        self.clock = clock or SystemClock()
        self.max_buckets = max_buckets
        self.instance = instance or os.urandom(6).hex()
        self.stats = Stats()
        self._buckets: OrderedDict[tuple[str, BucketKey], _Bucket] = OrderedDict()
        self._unheld: OrderedDict[tuple[str, BucketKey], _Bucket] = OrderedDict()
        self._leaving: set[asyncio.Task[None]] = set()
        self._streams = itertools.count(1)

    def now_ms(self) -> int:
        return self.clock.time_ns() // 1_000_000

    def open(self) -> QuotaStream:
        self.stats.streams += 1
        return QuotaStream(self, f"{self.instance}/{next(self._streams)}")

    async def use(self, rules: Sequence[BucketRule]) -> None:
        """New rules (a reload): each bucket tracked takes its new entry, whose
        total the next report puts in force; a bucket no entry matches any more
        is abandoned by its holders at their next report."""
        self.rules = tuple(rules)
        for bucket in list(self._buckets.values()):
            rule = match(self.rules, bucket.domain, dict(bucket.key))
            if rule is None:
                self._drop(bucket)
                continue
            bucket.rule = rule  # a changed total reaches the coordinator at the next report

    def _bucket(self, domain: str, key: BucketKey, rule: BucketRule) -> _Bucket:
        index = (domain, key)
        found = self._buckets.get(index)
        if found is not None:
            self._buckets.move_to_end(index)
            self._unheld.pop(index, None)
            return found
        while len(self._buckets) >= self.max_buckets:
            # first a bucket no stream holds (its proxies gone, their leaves
            # pending), then the one reported least recently
            if self._unheld:
                _, oldest = self._unheld.popitem(last=False)
            else:
                _, oldest = self._buckets.popitem(last=False)
            self.stats.evicted += 1
            self._drop(oldest)
        found = self._buckets[index] = _Bucket(key, domain, resource_name(domain, key), rule)
        self.stats.buckets = len(self._buckets)
        return found

    def _touch(self, bucket: _Bucket) -> None:
        """``bucket`` was reported: the last to go past the bound."""
        index = (bucket.domain, bucket.key)
        if index in self._buckets:
            self._buckets.move_to_end(index)

    def _drop(self, bucket: _Bucket) -> None:
        """Stop tracking ``bucket``: its holders abandon it at their next report."""
        self._buckets.pop((bucket.domain, bucket.key), None)
        self._unheld.pop((bucket.domain, bucket.key), None)
        self.stats.buckets = len(self._buckets)
        if bucket.rebalancing is not None:
            bucket.rebalancing.cancel()
        for stream in bucket.holders:
            stream._abandon(bucket.key)
        bucket.holders.clear()
        self.coordinators.forget(bucket.resource)

    def _rebalance(self, bucket: _Bucket) -> None:
        """A holder's grant is short of its share, or its demand fell: soon
        (joins that come together are taken together), every holder here
        refreshes and is sent its new assignment, those whose grants the others
        hold last, so that the others have shrunk by then. At most one a
        bucket a `REBALANCE_EVERY`: each is a refresh of every holder. Holders
        on other instances follow at their next report."""
        task = bucket.rebalancing
        if task is not None and not task.done():
            return
        delay = max(REBALANCE_AFTER, bucket.next_rebalance - time.monotonic())
        bucket.rebalancing = asyncio.get_running_loop().create_task(self._rebalanced(bucket, delay))

    async def _rebalanced(self, bucket: _Bucket, delay: float) -> None:
        await asyncio.sleep(delay)
        bucket.next_rebalance = time.monotonic() + REBALANCE_EVERY
        try:
            holders = sorted(bucket.holders, key=lambda s: s._short(bucket.key))
            for stream in holders:
                action = await stream._again(bucket.key)
                if action is not None and stream.on_push is not None:
                    stream.on_push([action])
        except StoreError as exc:
            log.warning("rlqs: a rebalance of %s failed: %s", bucket.resource, exc)

    def _release(self, bucket: _Bucket, stream: QuotaStream, *, told_until: int | None) -> None:
        """``stream`` no longer holds ``bucket``. ``told_until``: when its
        proxy's last assignment ends (ms, the service's clock): its member
        leaves the coordinator then, and the others here are rebalanced, so
        that its share moves when the proxy stops spending it, within the
        lease; None: the proxy forgot the bucket (abandoned), nothing to wait
        for."""
        bucket.holders.discard(stream)
        if told_until is not None:
            delay = max(0.0, (told_until - self.now_ms()) / 1000) + LEAVE_MARGIN
            bucket.leaving += 1
            loop = asyncio.get_running_loop()
            loop.call_later(delay, self._start_leave, bucket, stream.member)
        self._settle(bucket)

    def _start_leave(self, bucket: _Bucket, member: str) -> None:
        task = asyncio.get_running_loop().create_task(self._leave(bucket, member))
        self._leaving.add(task)  # held until done: a task nobody holds may vanish
        task.add_done_callback(self._leaving.discard)

    def _settle(self, bucket: _Bucket) -> None:
        if bucket.holders or (bucket.domain, bucket.key) not in self._buckets:
            return
        if bucket.leaving:
            self._unheld[(bucket.domain, bucket.key)] = bucket
        else:
            self._drop(bucket)

    async def _leave(self, bucket: _Bucket, member: str) -> None:
        bucket.leaving -= 1
        if (bucket.domain, bucket.key) not in self._buckets:
            return  # dropped meanwhile: its state is gone with it
        try:
            await self.coordinators.leave(bucket.resource, member)
        except StoreError as exc:  # its lease ends it all the same
            log.warning("rlqs: %s could not leave %s: %s", member, bucket.resource, exc)
        if bucket.holders:
            self._rebalance(bucket)
        self._settle(bucket)

    async def statuses(self) -> list[QuotaStatus]:
        """Each bucket tracked here, as its coordinator sees it."""
        found = [await self.coordinators.show(b.resource) for b in list(self._buckets.values())]
        return [status for status in found if status is not None]


class QuotaStream:
    """One proxy's stream: a member of each bucket it reports."""

    def __init__(self, service: QuotaService, member: str) -> None:
        self.service = service
        self.member = member
        self.domain: str | None = None
        self._held: dict[BucketKey, _Held] = {}
        self._abandoning: set[BucketKey] = set()
        self._uneven: set[BucketKey] = set()  # buckets to rebalance after this report
        # where actions go between reports (the stream's writer); None: nowhere
        self.on_push: Callable[[list[Action]], None] | None = None

    def _abandon(self, key: BucketKey) -> None:
        if self._held.pop(key, None) is not None:
            self._abandoning.add(key)

    def close(self) -> None:
        """The stream ended: each share stays with the coordinator until its
        proxy's last assignment ends, then its member leaves (see the module's
        docstring)."""
        service = self.service
        service.stats.streams -= 1
        for held in self._held.values():
            told = held.told_ms + held.bucket.rule.ttl * 1000 if held.reported else None
            service._release(held.bucket, self, told_until=told)
        self._held.clear()

    async def report(self, domain: str, usages: Sequence[Usage]) -> list[Action]:
        """One report's usages in, the actions to answer with out."""
        if self.domain is None:
            if not domain:
                raise ConfigurationError("the first report of a stream names its domain")
            self.domain = domain
        elif domain and domain != self.domain:
            raise ConfigurationError(
                f"the stream's domain is {self.domain!r}, a report says {domain!r}:"
                " a new domain needs a new stream"
            )
        service = self.service
        abandoned = self._abandoning
        self._abandoning = set()
        actions = [Action(key, "abandon") for key in sorted(abandoned)]
        now = service.now_ms()
        for usage in usages:
            if abandoned and bucket_key(usage.bucket) in abandoned:
                continue  # told to abandon it in this answer
            action = await self._one(usage, now)
            if action is not None:
                actions.append(action)
        uneven, self._uneven = self._uneven, set()
        for key in uneven:
            held = self._held.get(key)
            if held is not None:
                service._rebalance(held.bucket)
        return actions

    async def _one(self, usage: Usage, now: int) -> Action | None:
        service, domain = self.service, self.domain or ""
        key = bucket_key(usage.bucket)
        held = self._held.get(key)
        if held is None:
            rule = match(service.rules, domain, usage.bucket)
            if rule is None:
                service.stats.unmatched += 1
                return Action(key, "assign", Assignment("allow"), ALLOW_TTL)
            if len(self._held) >= max(1, service.max_buckets // 4):
                raise TooManyBuckets(
                    f"a stream holds at most {max(1, service.max_buckets // 4)} buckets"
                )
            bucket = service._bucket(domain, key, rule)
            bucket.holders.add(self)
            held = self._held[key] = _Held(bucket, now, now)
        bucket = held.bucket
        service._touch(bucket)
        rule = bucket.rule
        stats = service.stats
        stats.allowed[rule.name] = stats.allowed.get(rule.name, 0) + usage.allowed
        stats.denied[rule.name] = stats.denied.get(rule.name, 0) + usage.denied
        requests = usage.allowed + usage.denied
        if requests:
            held.active_ms = now
        if held.reported and now - held.last_ms < MIN_GAP_MS:
            # reported again at once (a client that floods reports): counted
            # toward the next refresh, answered with what the proxy holds, and
            # no call to the coordinator
            held.early_allowed += usage.allowed
            held.early_requests += requests
            return Action(key, "assign", held.assignment, rule.ttl)
        allowed = usage.allowed + held.early_allowed
        requests += held.early_requests
        held.early_allowed = held.early_requests = 0
        if not requests and now - held.active_ms >= rule.abandon_after * 1000:
            stats.abandoned += 1
            del self._held[key]
            service._release(bucket, self, told_until=None)
            return Action(key, "abandon")
        window = rule.quota.rate.period
        total = rule.quota.rate.limit * MILLI
        if not held.reported:
            wants = total  # not known yet: the allocation caps it at a share
            used = 0
        else:
            seconds = max(now - held.last_ms, 50) / 1000
            per_window = (requests / seconds * HEADROOM + 1) * window
            wants = min(total, math.ceil(per_window * MILLI))
            if held.measured:
                wants = max(wants, int(held.wants * FALL))
            held.measured = True
            used = min(total, round(allowed / seconds * window * MILLI))
        fell = held.reported and (held.wants - wants) * 10 >= total
        held.reported, held.last_ms, held.wants, held.used = True, now, wants, used
        short = await self._refresh(held)
        if short or fell:
            self._uneven.add(key)
        return Action(key, "assign", held.assignment, rule.ttl)

    async def _refresh(self, held: _Held) -> bool:
        """Tell the coordinator what ``held`` wants, take its grant; whether the
        grant falls short of what the allocation gives it (the others hold the
        rest)."""
        coordinators, bucket = self.service.coordinators, held.bucket
        rule = bucket.rule
        # with its configuration: a missing resource is made from it
        report = Report(held.wants, held.has, held.used, pieces=held.pieces, restore=rule.fields)
        reply = await coordinators.refresh(bucket.resource, self.member, report)
        if _stale(reply.fields, rule):
            # the resource holds another total (a reload here, or one stored by
            # an instance with other rules): the rule file in force here decides
            await coordinators.set(bucket.resource, rule.quota)
            reply = await coordinators.refresh(bucket.resource, self.member, report)
        held.has, held.pieces = reply.grant, reply.pieces
        held.told_ms = self.service.now_ms()
        new = assign(reply.grant / MILLI / rule.quota.rate.period)
        held.assignment = steady(held.assignment, new)
        # short of its share by more than a request a second or a twentieth: what
        # the others hold keeps it below its share until they refresh
        held.short = reply.target is not None and reply.target - reply.grant > max(
            round(MILLI * rule.quota.rate.period), reply.target // 20
        )
        return held.short

    def _short(self, key: BucketKey) -> bool:
        held = self._held.get(key)
        return held is not None and held.short

    async def _again(self, key: BucketKey) -> Action | None:
        """A refresh of ``key`` between reports, with the figures of the last."""
        held = self._held.get(key)
        if held is None or not held.reported:
            return None
        await self._refresh(held)
        return Action(key, "assign", held.assignment, held.bucket.rule.ttl)


def _stale(fields: Mapping[str, str], rule: BucketRule) -> bool:
    wanted = rule.fields
    names = ("total", "window_ms", "algorithm", "lease_ms")
    return any(fields.get(name) != wanted[name] for name in names)
