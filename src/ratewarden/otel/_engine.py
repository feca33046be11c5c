"""`instrument`: a rule engine's checks counted and timed for OpenTelemetry.

An engine counts nothing by itself (the service counts its checks in its own
`Tally`); `instrument` gives one engine a tally and its instruments, and wraps
that engine's ``check`` and ``unidentified`` (``acheck``, ``aunidentified``) so
that each check is timed and counted into the tally as the service counts it.
Other engines, the service's among them, are left as they are and pay nothing.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from opentelemetry.metrics import MeterProvider

from ..primitives import ConfigurationError, StoreError
from ..rules import AsyncRuleEngine, Outcome, RuleEngine, Tally
from ._instruments import TallyInstruments, observe

__all__ = ["EngineMetrics", "instrument"]

ENDPOINT = "check"  # the duration histogram's endpoint for an engine's checks
_SYNC = ("check", "unidentified")
_ASYNC = ("acheck", "aunidentified")


class EngineMetrics:
    """An instrumented engine's counts (``tally``) and instruments
    (``instruments``); `uninstrument` gives the engine its own methods back.
    Several engines may be instrumented on one meter provider: its counters
    report their sums."""

    def __init__(self, engine: RuleEngine | AsyncRuleEngine, instruments: TallyInstruments) -> None:
        self.engine = engine
        self.instruments = instruments
        self.tally = instruments.tally

    def uninstrument(self) -> None:
        """Stop counting this engine's checks; what was counted stays reported
        (a counter does not go back)."""
        for name in (*_SYNC, *_ASYNC):
            self.engine.__dict__.pop(name, None)

    def __repr__(self) -> str:
        return f"<EngineMetrics {self.engine!r} {self.tally!r}>"


def instrument(
    engine: RuleEngine | AsyncRuleEngine, *, meter_provider: MeterProvider | None = None,
    latency: bool = True,
) -> EngineMetrics:  # fmt: skip
    """Count and time every check of ``engine`` on the meter ``ratewarden`` of
    ``meter_provider`` (default: the global one, ``metrics.get_meter_provider()``),
    with the instruments `ratewarden.otel` lists, labelled by rule name.
    ``latency=False``: counted, not timed (the SDK's histogram takes about 4 us a
    record, as much as a check on the memory store). `ConfigurationError` for an
    engine instrumented already."""
    names = _SYNC if isinstance(engine, RuleEngine) else _ASYNC
    if any(name in engine.__dict__ for name in names):
        raise ConfigurationError(f"{engine!r} is instrumented already")
    instruments = observe(Tally(), meter_provider=meter_provider, latency=latency)
    for name in names:
        method = getattr(engine, name)
        wrapped = _timed(engine, method, instruments) if names is _SYNC else (
            _atimed(engine, method, instruments))  # fmt: skip
        engine.__dict__[name] = wrapped  # the instance's, before the class's method
    return EngineMetrics(engine, instruments)


def _timed(
    engine: Any, method: Callable[..., Outcome], instruments: TallyInstruments
) -> Callable[..., Outcome]:
    tally, record, clock = instruments.tally, instruments.record, time.perf_counter
    if instruments.duration is None:
        return _counted(engine, method, tally)

    @functools.wraps(method)
    def checked(attributes: Mapping[str, object], **options: Any) -> Outcome:
        started = clock()
        try:
            outcome = method(attributes, **options)
        except StoreError:  # a limit whose failure policy is "raise"
            tally.store_errors += 1
            raise
        finally:
            record(ENDPOINT, clock() - started)
        if outcome.limits:
            tally.outcome(outcome, engine.ruleset)
        return outcome

    return checked


def _atimed(
    engine: Any, method: Callable[..., Awaitable[Outcome]], instruments: TallyInstruments
) -> Callable[..., Awaitable[Outcome]]:
    tally, record, clock = instruments.tally, instruments.record, time.perf_counter
    if instruments.duration is None:
        return _acounted(engine, method, tally)

    @functools.wraps(method)
    async def checked(attributes: Mapping[str, object], **options: Any) -> Outcome:
        started = clock()
        try:
            outcome = await method(attributes, **options)
        except StoreError:
            tally.store_errors += 1
            raise
        finally:
            record(ENDPOINT, clock() - started)
        if outcome.limits:
            tally.outcome(outcome, engine.ruleset)
        return outcome

    return checked


def _counted(engine: Any, method: Callable[..., Outcome], tally: Tally) -> Callable[..., Outcome]:
    @functools.wraps(method)
    def checked(attributes: Mapping[str, object], **options: Any) -> Outcome:
        try:
            outcome = method(attributes, **options)
        except StoreError:
            tally.store_errors += 1
            raise
        if outcome.limits:
            tally.outcome(outcome, engine.ruleset)
        return outcome

    return checked


def _acounted(
    engine: Any, method: Callable[..., Awaitable[Outcome]], tally: Tally
) -> Callable[..., Awaitable[Outcome]]:
    @functools.wraps(method)
    async def checked(attributes: Mapping[str, object], **options: Any) -> Outcome:
        try:
            outcome = await method(attributes, **options)
        except StoreError:
            tally.store_errors += 1
            raise
        if outcome.limits:
            tally.outcome(outcome, engine.ruleset)
        return outcome

    return checked
