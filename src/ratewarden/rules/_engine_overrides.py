"""An engine's runtime overrides, as a part the engine owns and calls
(`Overrides` for `RuleEngine`, `AsyncOverrides` for `AsyncRuleEngine`): where
they live, setting, clearing, listing and the audit, and following a shared
store's changes.

With a Redis store the overrides live in that Redis and are followed (a
thread, or a task started on the first check), so that every service instance
and library process on the store applies a change within a second; with any
other store they are this process's own.

The part is given what it needs of its engine and nothing more: the rule set
in force (``ruleset``), a way to check that a limit builds (``build``), and a
way to change the engine's `OverrideView` under its lock (``change``). The
follower holds the engine's ``take`` weakly, so that a dropped engine stops it.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from ..primitives import ConfigurationError, StoreUnavailable, test_switch
from ._compile import LimitSpec, RuleSet
from ._override_stores import AsyncRedisOverrides, LocalOverrides, RedisOverrides, Snapshot
from ._override_view import Follower, OverrideView, clear_record, follow_async, new_record
from .overrides import AuditEntry, OverrideRecord, RuntimeOverride, substitutions

__all__ = ["AsyncOverrides", "Change", "Overrides"]

log = logging.getLogger("ratewarden.rules")

R = TypeVar("R", RedisOverrides, AsyncRedisOverrides)
# runs an edit of the engine's view under its lock; the edit says whether the
# limits in force change, and the engine then builds them again
Change = Callable[[Callable[[OverrideView], bool]], None]
Take = Callable[[Snapshot], None]


class _Overrides(Generic[R]):
    """What both parts share, ``R`` their kind of Redis overrides."""

    _redis: type[R]  # the kind of Redis overrides of a Redis store

    def __init__(
        self, store: Any, *, enabled: bool, namespace: str, ruleset: Callable[[], RuleSet],
        build: Callable[[LimitSpec], object], change: Change, take: weakref.WeakMethod[Take],
    ) -> None:  # fmt: skip
        client = getattr(store, "client", None)
        if not enabled:
            source: LocalOverrides | R | None = None
        elif client is None:
            source = LocalOverrides(store.clock)
        else:
            source = self._redis(client, namespace)
        self.source: LocalOverrides | R | None = source
        self._ruleset = ruleset
        self._build = build
        self._change = change
        self._take = take
        switch = test_switch()
        if switch is not None and isinstance(source, LocalOverrides):
            switch.track(self, "forget")  # the pytest plugin's reset ends them
        self._begin()

    def forget(self) -> None:
        """End every override of this process's own now, here and in the store."""
        if isinstance(self.source, LocalOverrides):
            now, rules = self.source.forget()
            for rule in rules:
                self._applied(now, None, rule)

    def _begin(self) -> None:
        """Start following a Redis store's overrides, as the kind of engine can."""
        raise NotImplementedError

    def _source(self) -> LocalOverrides | R:
        if self.source is None:
            raise ConfigurationError("this engine was made with overrides=False")
        return self.source

    def _prepare(
        self, rule: str, limits: Sequence[str] | str, duration: object, reason: object, by: object
    ) -> tuple[OverrideRecord, float]:
        ruleset = self._ruleset()
        record, seconds = new_record(ruleset, rule, limits, duration, reason, by)
        subs, problems = substitutions(ruleset, {rule: record})
        if problems:  # new_record checked this rule set: cannot happen, but never store junk
            raise ConfigurationError(problems[0])
        for spec in subs.values():
            self._build(spec)  # the limit must be one the algorithm accepts
        return record, seconds

    def _clear_record(self, rule: str, reason: str, by: str) -> OverrideRecord:
        return clear_record(self._ruleset(), rule, reason, by)

    def _was_set(
        self, now: int, stored: OverrideRecord | None, previous: OverrideRecord | None, rule: str
    ) -> RuntimeOverride:
        """A change the source made: in force here at once, and as it answers."""
        self._applied(now, stored, rule)
        assert stored is not None
        return RuntimeOverride.of(stored, now, None if previous is None else previous.limits)

    def _was_cleared(self, now: int, previous: OverrideRecord | None, rule: str) -> bool:
        self._applied(now, None, rule)
        return previous is not None

    def _applied(self, now: int, stored: OverrideRecord | None, rule: str) -> None:
        """Apply a change here at once, not when the channel brings it back."""

        def edit(view: OverrideView) -> bool:
            if stored is not None and stored.expires_at > now:
                view.add(now, stored)
            else:
                view.remove(rule)
            view.changed(now)  # a read begun before this must not undo it
            return True

        self._change(edit)


def take_into(change: Change) -> Take:
    """Put a snapshot of the store's overrides in force through ``change``."""
    return lambda snapshot: change(lambda view: view.take(snapshot))


def _runtime(snapshot: Snapshot) -> list[RuntimeOverride]:
    now, records = snapshot
    return [RuntimeOverride.of(records[rule], now) for rule in sorted(records)]


def _count(count: int) -> int:
    if type(count) is not int or not 1 <= count <= 1000:
        raise ConfigurationError(f"count must be 1..1000, got {count!r}")
    return count


class Overrides(_Overrides[RedisOverrides]):
    """`RuleEngine`'s overrides. ``take``: the engine's (held weakly by the
    follower thread, which a Redis store's overrides get)."""

    _redis = RedisOverrides
    _follower: Follower | None = None

    def _begin(self) -> None:
        source = self.source
        if isinstance(source, RedisOverrides):
            try:  # in force from the first check; the thread keeps them current
                take_into(self._change)(source.read())
            except StoreUnavailable as exc:
                log.warning("runtime overrides not read yet: %s", exc)
            self._follower = Follower(self._take, source)

    def set(
        self, rule: str, limits: Sequence[str] | str, duration: float | str, reason: str, by: str
    ) -> RuntimeOverride:
        record, seconds = self._prepare(rule, limits, duration, reason, by)
        return self._was_set(*self._source().change("set", record, seconds), rule)

    def clear(self, rule: str, reason: str, by: str) -> bool:
        now, _, previous = self._source().change("clear", self._clear_record(rule, reason, by), 0)
        return self._was_cleared(now, previous, rule)

    def listed(self) -> list[RuntimeOverride]:
        return _runtime(self._source().read())

    def audit(self, count: int) -> list[AuditEntry]:
        return [change.entry() for change in self._source().audit(_count(count))]

    def close(self) -> None:
        follower, self._follower = self._follower, None
        if follower is not None:
            follower.stop()


class AsyncOverrides(_Overrides[AsyncRedisOverrides]):
    """`AsyncRuleEngine`'s overrides (the twins of `Overrides`'s). A Redis
    store's are followed by a task, which needs the running loop: the engine's
    first check starts it (`pending` until then)."""

    _redis = AsyncRedisOverrides
    _follower: asyncio.Task[None] | None = None

    def _begin(self) -> None:
        self.pending = isinstance(self.source, AsyncRedisOverrides)

    def follow(self) -> None:
        self.pending = False
        self._follower = asyncio.get_running_loop().create_task(
            follow_async(self._take, self.source), name="ratewarden-overrides"
        )

    async def start(self) -> None:
        source = self.source
        if isinstance(source, AsyncRedisOverrides):
            take_into(self._change)(await source.read())
        if self.pending:
            self.follow()

    async def set(
        self, rule: str, limits: Sequence[str] | str, duration: float | str, reason: str, by: str
    ) -> RuntimeOverride:
        record, seconds = self._prepare(rule, limits, duration, reason, by)
        source = self._source()
        if isinstance(source, AsyncRedisOverrides):
            now, stored, previous = await source.change("set", record, seconds)
        else:
            now, stored, previous = source.change("set", record, seconds)
        return self._was_set(now, stored, previous, rule)

    async def clear(self, rule: str, reason: str, by: str) -> bool:
        record = self._clear_record(rule, reason, by)
        source = self._source()
        if isinstance(source, AsyncRedisOverrides):
            now, _, previous = await source.change("clear", record, 0)
        else:
            now, _, previous = source.change("clear", record, 0)
        return self._was_cleared(now, previous, rule)

    async def listed(self) -> list[RuntimeOverride]:
        source = self._source()
        if isinstance(source, AsyncRedisOverrides):
            return _runtime(await source.read())
        return _runtime(source.read())

    async def audit(self, count: int) -> list[AuditEntry]:
        source = self._source()
        count = _count(count)
        if isinstance(source, AsyncRedisOverrides):
            changes = await source.audit(count)
        else:
            changes = source.audit(count)
        return [change.entry() for change in changes]

    async def close(self) -> None:
        self.pending = False
        task, self._follower = self._follower, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                if not task.cancelled():  # our own caller was cancelled too
                    raise
