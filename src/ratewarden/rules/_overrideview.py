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
from typing import TYPE_CHECKING, Any, TypeVar

from .._clock import Clock
from .._errors import ConfigurationError, StoreUnavailable
from ._compile import LimitSpec, RuleSet
from ._overrides import (
    MAX_BY,
    MAX_REASON,
    OverrideRecord,
    check_override,
    check_text,
    parse_duration,
    substitutions,
)
from ._overridesrc import Snapshot

if TYPE_CHECKING:
    from ._engine import AsyncRuleEngine, RuleEngine

__all__ = ["Follower", "OverrideView", "follow_async", "new_record"]

log = logging.getLogger("ratewarden.rules")

L = TypeVar("L")
SUBSCRIBED_POLL = 2.0  # seconds between reads while the channel is heard
UNSUBSCRIBED_POLL = 0.5  # without the channel, reads alone keep "within a second"
MIN_GAP = 0.05  # between two reads, so that a flood of messages costs few reads


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
    file_rates = () if known is None else tuple(str(s.rate) for s in known.limits)
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
        self.lock = threading.Lock()  # one change of the view at a time

    def take(self, snapshot: Snapshot) -> bool:
        """Put ``snapshot`` (the source's clock and its records) in force; True
        if that changes anything."""
        source_now, records = snapshot
        local_now = self.clock.time_ns()
        deadlines = {
            rule: local_now + (record.expires_at - source_now) * 1_000_000
            for rule, record in records.items()
        }
        if records == self.records:
            self.deadlines = deadlines  # the same overrides: only refresh the clocks' offset
            return False
        self.records = dict(records)
        self.deadlines = deadlines
        self.next_expiry = min(deadlines.values(), default=None)
        return True

    def add(self, snapshot_now: int, record: OverrideRecord) -> None:
        records = dict(self.records)
        records[record.rule] = record
        self.take((snapshot_now, records))

    def remove(self, rule: str) -> None:
        if rule in self.records:
            records = {k: v for k, v in self.records.items() if k != rule}
            deadlines = {k: v for k, v in self.deadlines.items() if k != rule}
            self.records, self.deadlines = records, deadlines
            self.next_expiry = min(deadlines.values(), default=None)

    def expire(self) -> bool:
        """Drop what has expired by now; True if something was."""
        now = self.clock.time_ns()
        gone = [rule for rule, deadline in self.deadlines.items() if deadline <= now]
        for rule in gone:
            self.remove(rule)
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


class Follower:
    """A daemon thread that keeps an engine up to date with a shared source
    until `stop` or until the engine is gone (it holds the engine weakly)."""

    def __init__(self, engine: RuleEngine, source: Any) -> None:
        self._ref = weakref.ref(engine)
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
            target = self._ref()
            if target is None:
                break
            try:
                target._take_overrides(source.read())
            except StoreUnavailable as exc:
                log.debug("overrides not read: %s", exc)
            except Exception:  # never let the thread die: overrides would freeze
                log.exception("overrides not read")
            del target
            last_read = time.monotonic()
            pubsub = self._pubsub
            try:
                if pubsub is not None:
                    get = pubsub.get_message
                    message = get(ignore_subscribe_messages=True, timeout=SUBSCRIBED_POLL)
                    while message is not None:  # a burst of changes: one read after it
                        message = get(ignore_subscribe_messages=True, timeout=0.0)
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


async def follow_async(engine: AsyncRuleEngine, source: Any) -> None:
    """The asyncio twin of `follow_sync`: run as a task, cancelled to stop."""
    ref = weakref.ref(engine)
    pubsub = None
    last_read = -MIN_GAP
    try:
        while True:
            await asyncio.sleep(max(0.0, MIN_GAP - (time.monotonic() - last_read)))
            if pubsub is None:
                with suppress(Exception):
                    pubsub = await source.subscribe()
            target = ref()
            if target is None:
                return
            try:
                target._take_overrides(await source.read())
            except StoreUnavailable as exc:
                log.debug("overrides not read: %s", exc)
            except Exception:
                log.exception("overrides not read")
            del target
            last_read = time.monotonic()
            try:
                if pubsub is not None:
                    get = pubsub.get_message
                    message = await get(ignore_subscribe_messages=True, timeout=SUBSCRIBED_POLL)
                    while message is not None:
                        message = await get(ignore_subscribe_messages=True, timeout=0.0)
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
