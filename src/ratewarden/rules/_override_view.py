"""An engine's view of the runtime overrides: which are in force here and
until when (on the engine's own clock), the limiters they give a rule set, and
the loop (a thread, or an asyncio task) that follows a shared store's changes.

Expiry costs a request nothing but one comparison: the view knows its next
deadline, and the engine drops what has expired when a request comes after it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar

from ..primitives import Clock, ConfigurationError, StoreUnavailable
from ._compile import LimitSpec, RuleSet
from ._override_stores import Snapshot
from .overrides import (
    MAX_BY,
    MAX_REASON,
    OverrideRecord,
    check_override,
    check_text,
    parse_duration,
    substitutions,
)

__all__ = ["Follower", "OverrideView", "follow_async", "new_record"]

log = logging.getLogger("ratewarden.rules")

L = TypeVar("L")
SUBSCRIBED_POLL = 2.0  # seconds between reads while the channel is heard
UNSUBSCRIBED_POLL = 0.5  # without the channel, reads alone keep "within a second"
MIN_GAP = 0.05  # between two reads, so that a flood of messages costs few reads
DRAINED = 100  # messages taken at most before the next read, whatever the channel does
STALE_READ = 5.0  # seconds a read may have been in flight (longer than any timeout)


def new_record(  # noqa: PLR0917 - the engine's keyword arguments, passed on
    ruleset: RuleSet, rule: object, limits: object, duration: object, reason: object,
    by: object,
) -> tuple[OverrideRecord, float]:  # fmt: skip
    """A checked override (not yet stored) and its duration in seconds."""
    rates, file_rates = check_override(ruleset, rule, limits)
    seconds = parse_duration(duration)
    why = check_text("reason", reason, MAX_REASON, required=True)
    who = check_text("by", by, MAX_BY, required=False)
    return OverrideRecord(str(rule), rates, file_rates, why, who), seconds


def clear_record(ruleset: RuleSet, rule: object, reason: object, by: object) -> OverrideRecord:
    if not isinstance(rule, str) or not rule:
        raise ConfigurationError("name the rule whose override ends")
    known = ruleset.by_name.get(rule)
    file_rates = () if known is None else tuple(str(s.file_rate) for s in known.limits)
    why = check_text("reason", reason, MAX_REASON, required=False)
    who = check_text("by", by, MAX_BY, required=False)
    return OverrideRecord(rule, (), file_rates, why, who)


class OverrideView:
    """The overrides in force for one engine, each with its local deadline."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.records: dict[str, OverrideRecord] = {}
        self.deadlines: dict[str, int] = {}  # rule -> clock.time_ns() when it ends
        self.next_expiry: int | None = None  # the earliest deadline; None: nothing to expire
        self.problems: tuple[str, ...] = ()
        # (source ms, local ns) of the last change made here, while reads may predate it
        self._changed: tuple[int, int] | None = None

    def take(self, snapshot: Snapshot) -> bool:
        """Put ``snapshot`` (the source's clock and its records) in force; True
        if that changes anything. A read that began before a change this engine
        made (the follower's, landing just after `changed`) is older than what
        is in force and is ignored: it would undo the change until the next read."""
        source_now, records = snapshot
        mark = self._changed
        if mark is not None:
            changed_at, local_at = mark
            if self.clock.time_ns() - local_at > STALE_READ * 1_000_000_000:
                self._changed = None  # a read in flight is long over: trust them all
            elif source_now <= changed_at:
                return False
        return self._put(source_now, records)

    def _put(self, source_now: int, records: dict[str, OverrideRecord]) -> bool:
        local_now = self.clock.time_ns()
        deadlines = {
            rule: local_now + (record.expires_at - source_now) * 1_000_000
            for rule, record in records.items()
        }
        # the same overrides: only the clocks' offset moves, and the next expiry with it
        changed = records != self.records
        if changed:
            self.records = dict(records)
        self.deadlines = deadlines
        self.next_expiry = min(deadlines.values(), default=None)
        return changed

    def add(self, snapshot_now: int, record: OverrideRecord) -> None:
        records = dict(self.records)
        records[record.rule] = record
        self._put(snapshot_now, records)

    def remove(self, rule: str) -> None:
        if rule in self.records:
            records = {k: v for k, v in self.records.items() if k != rule}
            deadlines = {k: v for k, v in self.deadlines.items() if k != rule}
            self.records, self.deadlines = records, deadlines
        self.next_expiry = min(self.deadlines.values(), default=None)

    def changed(self, source_now: int) -> None:
        """This engine changed the source at ``source_now`` (its clock) and put
        the change in force: reads that began before it are stale (see `take`)."""
        self._changed = (source_now, self.clock.time_ns())

    def expire(self) -> bool:
        """Drop what has expired by now; True if something was."""
        now = self.clock.time_ns()
        gone = [rule for rule, deadline in self.deadlines.items() if deadline <= now]
        for rule in gone:
            self.remove(rule)
        # also when nothing went: a read moved the deadlines since the next expiry was set
        self.next_expiry = min(self.deadlines.values(), default=None)
        return bool(gone)

    def limiters(
        self, ruleset: RuleSet, build: Callable[[LimitSpec], L],
        previous: tuple[RuleSet, tuple[LimitSpec, ...], tuple[L, ...]] | None,
    ) -> tuple[tuple[LimitSpec, ...], tuple[L, ...]]:  # fmt: skip
        """The limits ``ruleset`` runs with under these overrides, and their
        limiters (those of ``previous`` reused where the limit did not change)."""
        subs, problems = substitutions(ruleset, self.records)
        specs = list(ruleset.limits)
        for slot, spec in subs.items():
            specs[slot] = spec
        reuse = previous is not None and previous[0] is ruleset
        out: list[L] = []
        for slot, spec in enumerate(specs):
            if reuse and previous is not None and previous[1][slot] == spec:
                out.append(previous[2][slot])
                continue
            try:
                out.append(build(spec))
            except ConfigurationError as exc:  # e.g. a burst larger than the new limit allows
                problems.append(f"override of {spec.name!r} ignored: {exc}")
                specs[slot] = ruleset.limits[slot]
                out.append(build(specs[slot]))
        for problem in problems:
            if problem not in self.problems:
                log.warning("%s", problem)
        self.problems = tuple(problems)
        return tuple(specs), tuple(out)


# -- following a shared store -----------------------------------------------------


def _deliver(ref: weakref.WeakMethod[Any], snapshot: Snapshot) -> bool:
    """Put ``snapshot`` in force through the engine's ``take``, if the engine is
    still there. It is taken from its weak reference only now, after the read:
    held across the read, a dropped engine would live as long as the read takes."""
    take = ref()
    if take is None:
        return False
    take(snapshot)
    return True


class Follower:
    """A daemon thread that keeps an engine up to date with a shared source
    until `stop` or until the engine is gone: ``take`` is the engine's method
    that puts a snapshot in force, held weakly."""

    def __init__(self, take: weakref.WeakMethod[Any], source: Any) -> None:
        self._ref = take
        self._source = source
        self._stop = threading.Event()
        self._pubsub: Any = None
        self.thread = threading.Thread(target=self._run, name="ratewarden-overrides", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        pubsub = self._pubsub
        if pubsub is not None:  # wake the thread from its wait for a message
            with suppress(Exception):
                pubsub.close()
        self.thread.join(timeout=5)

    def _run(self) -> None:
        source, stop = self._source, self._stop
        last_read = -MIN_GAP
        while not stop.is_set():
            # never more than one read a MIN_GAP, whatever the channel does
            if stop.wait(max(0.0, MIN_GAP - (time.monotonic() - last_read))):
                break
            if self._pubsub is None:
                with suppress(Exception):
                    self._pubsub = source.subscribe()  # before reading: no change falls between
            if self._ref() is None:
                break
            try:
                if not _deliver(self._ref, source.read()):
                    break
            except StoreUnavailable as exc:
                log.debug("overrides not read: %s", exc)
            except Exception:  # never let the thread die: overrides would freeze
                log.exception("overrides not read")
            last_read = time.monotonic()
            pubsub = self._pubsub
            try:
                if pubsub is not None:
                    get = pubsub.get_message
                    message = get(ignore_subscribe_messages=True, timeout=SUBSCRIBED_POLL)
                    # a burst of changes: one read after it; a flood: a read every
                    # DRAINED messages, or the overrides would freeze while it lasts
                    drained = 0
                    while message is not None and drained < DRAINED:
                        message = get(ignore_subscribe_messages=True, timeout=0.0)
                        drained += 1
            except Exception as exc:  # a lost subscription: the next turn subscribes again
                log.debug("overrides channel lost: %s", exc)
                if pubsub is not None:
                    with suppress(Exception):
                        pubsub.close()
                self._pubsub = pubsub = None
            if pubsub is None:
                stop.wait(UNSUBSCRIBED_POLL)
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with suppress(Exception):
                pubsub.close()


async def follow_async(ref: weakref.WeakMethod[Any], source: Any) -> None:
    """The asyncio twin of `Follower`: run as a task, cancelled to stop. It
    holds the engine's ``take`` weakly, as the thread does, and ends once the
    engine is gone (the engine itself as an argument would live as long as the
    task's frame, which the loop keeps: engine and task would never go)."""
    task = asyncio.current_task()
    pubsub = None
    last_read = -MIN_GAP
    try:
        while True:
            # A cancellation counts even when a call swallowed it: Python 3.11's
            # asyncio.wait_for (redis-py's, on a send) returns the call's result
            # when it ends in the turn the cancel comes, and aclose would wait on.
            if task is not None and task.cancelling():
                raise asyncio.CancelledError
            await asyncio.sleep(max(0.0, MIN_GAP - (time.monotonic() - last_read)))
            if pubsub is None:
                with suppress(Exception):
                    pubsub = await source.subscribe()
            if ref() is None:
                return
            try:
                if not _deliver(ref, await source.read()):
                    return
            except StoreUnavailable as exc:
                log.debug("overrides not read: %s", exc)
            except Exception:
                log.exception("overrides not read")
            last_read = time.monotonic()
            try:
                if pubsub is not None:
                    get = pubsub.get_message
                    message = await get(ignore_subscribe_messages=True, timeout=SUBSCRIBED_POLL)
                    drained = 0
                    while message is not None and drained < DRAINED:
                        message = await get(ignore_subscribe_messages=True, timeout=0.0)
                        drained += 1
            except Exception as exc:  # CancelledError is no Exception: it ends the task
                log.debug("overrides channel lost: %s", exc)
                if pubsub is not None:
                    with suppress(Exception):
                        await pubsub.aclose()
                pubsub = None
            if pubsub is None:
                await asyncio.sleep(UNSUBSCRIBED_POLL)
    finally:
        if pubsub is not None:
            with suppress(Exception):
                await pubsub.aclose()
