"""`ratewarden.otel.instrument`: an engine's checks as OpenTelemetry instruments,
read by the SDK's in-memory reader: counts by rule and outcome, the latency
histogram, and never a key in an attribute."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader

from ratewarden import AsyncMemoryStore, ConfigurationError, FakeClock, MemoryStore
from ratewarden.otel import instrument
from ratewarden.rules import AsyncRuleEngine, RuleEngine, loads

# a key that looks like personal data: it must never reach an attribute
KEY = "alice@example.com"

RULES = textwrap.dedent("""
    rules:
      - name: orders
        rate: 3/minute
        algorithm: fixed_window
        by: user
        match: {paths: /api/orders}
      - name: everyone
        rate: 100/minute
        algorithm: fixed_window
        by: user
      - name: preview
        rate: 1/minute
        algorithm: fixed_window
        by: user
        action: log_only
        match: {paths: /api/preview}
""")


def orders(user: str = KEY) -> dict[str, object]:
    return {"method": "GET", "path": "/api/orders", "user": user}


def preview(user: str = KEY) -> dict[str, object]:
    return {"method": "GET", "path": "/api/preview", "user": user}


def collected(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    """Each instrument's data points, by name."""
    data = reader.get_metrics_data()
    assert data is not None
    points: dict[str, list[Any]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            assert scope.scope.name == "ratewarden"
            for metric in scope.metrics:
                points.setdefault(metric.name, []).extend(metric.data.data_points)
    return points


def by_rule(points: dict[str, list[Any]], name: str) -> dict[str, int]:
    return {str(p.attributes["rule"]): p.value for p in points.get(name, [])}


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def provider(reader: InMemoryMetricReader) -> MeterProvider:
    return MeterProvider(metric_readers=[reader])


def test_checks_are_counted_by_rule_and_outcome(
    reader: InMemoryMetricReader, provider: MeterProvider
) -> None:
    engine = RuleEngine(loads(RULES), MemoryStore(clock=FakeClock()))
    instrument(engine, meter_provider=provider)
    allowed = [engine.check(orders()).allowed for _ in range(5)]
    assert allowed == [True, True, True, False, False]
    assert [engine.check(preview()).allowed for _ in range(2)] == [True, True]
    points = collected(reader)
    assert by_rule(points, "ratewarden.checks") == {"orders": 5, "everyone": 7, "preview": 2}
    assert by_rule(points, "ratewarden.over_limit") == {"orders": 2}
    # the third order leaves 0 of 3: 80% or more used; the second leaves 1, 67% used
    assert by_rule(points, "ratewarden.near_limit") == {"orders": 1}
    assert by_rule(points, "ratewarden.shadow_over_limit") == {"preview": 1}
    assert by_rule(points, "ratewarden.degraded") == {}
    assert [p.value for p in points["ratewarden.store_errors"]] == [0]


def test_each_check_is_timed_in_the_latency_histogram(
    reader: InMemoryMetricReader, provider: MeterProvider
) -> None:
    engine = RuleEngine(loads(RULES), MemoryStore(clock=FakeClock()))
    instrument(engine, meter_provider=provider)
    for _ in range(4):
        engine.check(orders())
    engine.unidentified({"path": "/api/orders"})  # no user: no rule applies, still timed
    (point,) = collected(reader)["ratewarden.request.duration"]
    assert isinstance(point, HistogramDataPoint)
    assert point.attributes == {"endpoint": "check"}
    assert point.count == 5
    assert 0 < point.sum < 1  # seconds, not milliseconds
    assert point.explicit_bounds[:2] == (0.0001, 0.00025)  # the bounds /metrics uses


def test_no_key_ever_reaches_an_attribute(
    reader: InMemoryMetricReader, provider: MeterProvider
) -> None:
    engine = RuleEngine(loads(RULES), MemoryStore(clock=FakeClock()))
    instrument(engine, meter_provider=provider)
    for _ in range(5):
        engine.check(orders())
        engine.check(preview())
    data = reader.get_metrics_data()
    assert data is not None
    exported = data.to_json()
    assert "orders" in exported  # the rule names are there ...
    assert KEY not in exported  # ... and the key nowhere, in no attribute nor elsewhere
    assert "alice" not in exported


def test_an_async_engine_is_counted_the_same_way(
    reader: InMemoryMetricReader, provider: MeterProvider
) -> None:
    engine = AsyncRuleEngine(loads(RULES), AsyncMemoryStore(clock=FakeClock()))
    instrument(engine, meter_provider=provider)

    async def main() -> list[bool]:
        return [(await engine.acheck(orders())).allowed for _ in range(4)]

    assert asyncio.run(main()) == [True, True, True, False]
    points = collected(reader)
    assert by_rule(points, "ratewarden.checks") == {"orders": 4, "everyone": 4}
    assert by_rule(points, "ratewarden.over_limit") == {"orders": 1}
    assert points["ratewarden.request.duration"][0].count == 4


def test_the_global_meter_provider_is_the_default(
    reader: InMemoryMetricReader, provider: MeterProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics, "get_meter_provider", lambda: provider)
    engine = RuleEngine(loads(RULES), MemoryStore(clock=FakeClock()))
    instrument(engine)
    engine.check(orders())
    assert by_rule(collected(reader), "ratewarden.checks") == {"orders": 1, "everyone": 1}


def test_instrumenting_twice_is_refused_and_uninstrument_stops_the_counts(
    reader: InMemoryMetricReader, provider: MeterProvider
) -> None:
    engine = RuleEngine(loads(RULES), MemoryStore(clock=FakeClock()))
    counted = instrument(engine, meter_provider=provider)
    with pytest.raises(ConfigurationError, match="instrumented already"):
        instrument(engine, meter_provider=provider)
    engine.check(orders())
    assert counted.tally.checks == {"orders": 1, "everyone": 1}
    assert repr(counted.tally) == "<Tally checks=2 over_limit=0 store_errors=0>"
    counted.uninstrument()
    engine.check(orders())
    assert counted.tally.checks == {"orders": 1, "everyone": 1}
    assert "check" not in engine.__dict__  # the class's own method again
    # what was counted stays reported: a counter does not go back
    assert by_rule(collected(reader), "ratewarden.checks") == {"orders": 1, "everyone": 1}
    instrument(engine, meter_provider=provider)  # and it may be instrumented anew
    engine.check(orders())
    assert by_rule(collected(reader), "ratewarden.checks") == {"orders": 2, "everyone": 2}


def test_importing_ratewarden_or_serving_without_otel_imports_no_opentelemetry() -> None:
    code = (
        "import sys, ratewarden, ratewarden.rules, ratewarden.server._serve\n"
        "import ratewarden.server._app, ratewarden.server._process\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'opentelemetry'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_without_latency_the_checks_are_counted_not_timed(
    reader: InMemoryMetricReader, provider: MeterProvider
) -> None:
    engine = RuleEngine(loads(RULES), MemoryStore(clock=FakeClock()))
    async_engine = AsyncRuleEngine(loads(RULES), AsyncMemoryStore(clock=FakeClock()))
    instrument(engine, meter_provider=provider, latency=False)
    instrument(async_engine, meter_provider=provider, latency=False)
    for _ in range(4):
        engine.check(orders())
    asyncio.run(async_engine.acheck(orders()))
    points = collected(reader)
    assert "ratewarden.request.duration" not in points
    assert by_rule(points, "ratewarden.checks") == {"orders": 5, "everyone": 5}
    assert by_rule(points, "ratewarden.over_limit") == {"orders": 1}
