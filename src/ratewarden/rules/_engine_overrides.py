"""The engines' runtime-override methods: set, clear, list, audit, and the
choice of where overrides live (`Overridable` for `RuleEngine`,
`AsyncOverridable` for `AsyncRuleEngine`).

With a Redis store an engine keeps its overrides in that Redis and follows
them (a thread, or a task started on the first check), so that every service
instance and library process on the store applies a change within a second;
with any other store they are this process's own.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

from .._errors import ConfigurationError, StoreUnavailable
from ._override_stores import AsyncRedisOverrides, LocalOverrides, RedisOverrides, Snapshot
from ._override_view import Follower, OverrideView, clear_record, follow_async, new_record
from .overrides import AuditEntry, OverrideRecord, RuntimeOverride, substitutions

__all__ = ["AsyncOverridable", "Overridable"]

log = logging.getLogger("ratewarden.rules")

R = TypeVar("R", RedisOverrides, AsyncRedisOverrides)


class _Base(Generic[R]):
    """What both shells share, ``R`` their kind of Redis overrides; the engine's
    `_Core` provides the rest."""

    overrides_source: LocalOverrides | R | None
    _view: OverrideView
    _reloading: threading.Lock

    @property
    def ruleset(self) -> Any:  # _Core's
        raise NotImplementedError

    def _install(self, ruleset: Any) -> None:  # _Core's
        raise NotImplementedError

    def _limiter(self, spec: Any) -> Any:  # the engine shell's
        raise NotImplementedError

    def _take_overrides(self, snapshot: Snapshot) -> None:  # _Core's
        raise NotImplementedError

    def _choose_source(
        self, store: Any, overrides: bool, namespace: str, redis: type[R]
    ) -> LocalOverrides | R | None:
        """Where the overrides live: in the Redis of a Redis store (``redis``), else
        in this process; none at all without ``overrides``."""
        client = getattr(store, "client", None)
        if not overrides:
            source: LocalOverrides | R | None = None
        elif client is None:
            source = LocalOverrides(store.clock)
        else:
            source = redis(client, namespace)
        self.overrides_source = source
        return source

    def _source(self) -> LocalOverrides | R:
        if self.overrides_source is None:
            raise ConfigurationError("this engine was made with overrides=False")
        return self.overrides_source

    def _prepare(
        self, rule: str, limits: Sequence[str] | str, duration: object, reason: object, by: object
    ) -> tuple[OverrideRecord, float]:
        record, seconds = new_record(self.ruleset, rule, limits, duration, reason, by)
        subs, problems = substitutions(self.ruleset, {rule: record})
        if problems:  # new_record checked this rule set: cannot happen, but never store junk
            raise ConfigurationError(problems[0])
        for spec in subs.values():
            self._limiter(spec)  # the limit must be one the algorithm accepts
        return record, seconds

    def _applied(
        self, now: int, stored: OverrideRecord | None, previous: OverrideRecord | None, rule: str
    ) -> None:
        """Apply a change here at once, not when the channel brings it back."""
        with self._reloading:
            if stored is not None and stored.expires_at > now:
                self._view.add(now, stored)
            else:
                self._view.remove(rule)
            self._view.changed(now)  # a read begun before this must not undo it
            self._install(self.ruleset)


def _runtime(snapshot: Snapshot) -> list[RuntimeOverride]:
    now, records = snapshot
    return [RuntimeOverride.of(records[rule], now) for rule in sorted(records)]


class Overridable(_Base[RedisOverrides]):
    """`RuleEngine`'s override methods."""

    _follower: Follower | None

    def _setup_overrides(self, store: Any, overrides: bool, namespace: str) -> None:
        self._follower = None
        source = self._choose_source(store, overrides, namespace, RedisOverrides)
        if isinstance(source, RedisOverrides):
            try:  # in force from the first check; the thread keeps them current
                self._take_overrides(source.read())
            except StoreUnavailable as exc:
                log.warning("runtime overrides not read yet: %s", exc)
            self._follower = Follower(self, source)  # type: ignore[arg-type]

    def set_override(
        self, rule: str, limits: Sequence[str] | str, *, duration: float | str, reason: str,
        by: str = "",
    ) -> RuntimeOverride:  # fmt: skip
        """Replace ``rule``'s rates with ``limits`` for ``duration`` (seconds, or
        text such as ``"30m"``), recorded with ``reason`` and ``by`` in the
        audit trail. Raises `UnknownRule` or `ConfigurationError` for an override
        that cannot apply to the rules in force, `StoreUnavailable` when Redis
        cannot be reached."""
        record, seconds = self._prepare(rule, limits, duration, reason, by)
        now, stored, previous = self._source().change("set", record, seconds)
        self._applied(now, stored, previous, rule)
        assert stored is not None
        return RuntimeOverride.of(stored, now, None if previous is None else previous.limits)

    def clear_override(self, rule: str, *, reason: str = "", by: str = "") -> bool:
        """End ``rule``'s override now; False if it had none in force."""
        record = clear_record(self.ruleset, rule, reason, by)
        now, _, previous = self._source().change("clear", record, 0)
        self._applied(now, None, previous, rule)
        return previous is not None

    def list_overrides(self) -> list[RuntimeOverride]:
        """The overrides in force in the store (all rule files'), by rule name."""
        return _runtime(self._source().read())

    def override_audit(self, count: int = 100) -> list[AuditEntry]:
        """The last ``count`` changes, newest first (1000 are kept)."""
        return [change.entry() for change in self._source().audit(_count(count))]

    def close(self) -> None:
        """Stop following the store's overrides (a Redis store's)."""
        follower, self._follower = self._follower, None
        if follower is not None:
            follower.stop()


class AsyncOverridable(_Base[AsyncRedisOverrides]):
    """`AsyncRuleEngine`'s override methods (the twins of `Overridable`'s)."""

    _follower: asyncio.Task[None] | None
    _follow_pending: bool

    def _setup_overrides(self, store: Any, overrides: bool, namespace: str) -> None:
        self._follower = None
        source = self._choose_source(store, overrides, namespace, AsyncRedisOverrides)
        # a task needs the running loop: the first call starts it
        self._follow_pending = isinstance(source, AsyncRedisOverrides)

    def _start_following(self) -> None:
        self._follow_pending = False
        source = self.overrides_source
        self._follower = asyncio.get_running_loop().create_task(
            follow_async(weakref.ref(self), source),  # type: ignore[arg-type]
            name="ratewarden-overrides",
        )

    async def astart(self) -> None:
        """Read the store's overrides now and follow them from here on (the
        first check does this by itself; a service calls it at start-up so the
        overrides are in force before the first request)."""
        source = self.overrides_source
        if isinstance(source, AsyncRedisOverrides):
            self._take_overrides(await source.read())
        if self._follow_pending:
            self._start_following()

    async def aset_override(
        self, rule: str, limits: Sequence[str] | str, *, duration: float | str, reason: str,
        by: str = "",
    ) -> RuntimeOverride:  # fmt: skip
        """The twin of `RuleEngine.set_override`."""
        record, seconds = self._prepare(rule, limits, duration, reason, by)
        source = self._source()
        if isinstance(source, AsyncRedisOverrides):
            now, stored, previous = await source.change("set", record, seconds)
        else:
            now, stored, previous = source.change("set", record, seconds)
        self._applied(now, stored, previous, rule)
        assert stored is not None
        return RuntimeOverride.of(stored, now, None if previous is None else previous.limits)

    async def aclear_override(self, rule: str, *, reason: str = "", by: str = "") -> bool:
        """The twin of `RuleEngine.clear_override`."""
        record = clear_record(self.ruleset, rule, reason, by)
        source = self._source()
        if isinstance(source, AsyncRedisOverrides):
            now, _, previous = await source.change("clear", record, 0)
        else:
            now, _, previous = source.change("clear", record, 0)
        self._applied(now, None, previous, rule)
        return previous is not None

    async def alist_overrides(self) -> list[RuntimeOverride]:
        """The twin of `RuleEngine.list_overrides`."""
        source = self._source()
        if isinstance(source, AsyncRedisOverrides):
            return _runtime(await source.read())
        return _runtime(source.read())

    async def aoverride_audit(self, count: int = 100) -> list[AuditEntry]:
        """The twin of `RuleEngine.override_audit`."""
        source = self._source()
        count = _count(count)
        if isinstance(source, AsyncRedisOverrides):
            changes = await source.audit(count)
        else:
            changes = source.audit(count)
        return [change.entry() for change in changes]

    async def aclose(self) -> None:
        """Stop following the store's overrides."""
        self._follow_pending = False
        task, self._follower = self._follower, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                if not task.cancelled():  # our own caller was cancelled too
                    raise


def _count(count: int) -> int:
    if type(count) is not int or not 1 <= count <= 1000:
        raise ConfigurationError(f"count must be 1..1000, got {count!r}")
    return count
