"""`ratewarden.otel.observe`: any tally's counts, and the fleet quotas' gauges,
read when the meter provider collects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from ratewarden.otel import observe
from ratewarden.rules import Tally


@dataclass
class Status:  # the fields of a fleet quota's status the gauges read
    name: str
    effective_total: float
    wants: float
    granted: float
    used: float
    members: tuple[str, ...]


def points(reader: InMemoryMetricReader) -> dict[str, dict[str, Any]]:
    """Each instrument's values by its attributes' values (none: no instrument
    reported anything)."""
    data = reader.get_metrics_data()
    found: dict[str, dict[str, Any]] = {}
    if data is None:
        return found
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    label = ",".join(str(v) for v in (point.attributes or {}).values())
                    found.setdefault(metric.name, {})[label] = getattr(point, "value", None)
    return found


def test_the_counts_are_read_when_collected_not_when_counted() -> None:
    reader = InMemoryMetricReader()
    tally = Tally()
    instruments = observe(tally, meter_provider=MeterProvider(metric_readers=[reader]))
    tally.checks["login"] = 7
    tally.over_limit["login"] = 2
    tally.store_errors = 1
    got = points(reader)
    assert got["ratewarden.checks"] == {"login": 7}
    assert got["ratewarden.over_limit"] == {"login": 2}
    assert got["ratewarden.store_errors"] == {"": 1}
    assert "ratewarden.quota.total" not in got  # no reader of quotas given
    tally.checks["login"] = 9
    assert points(reader)["ratewarden.checks"] == {"login": 9}
    assert (
        repr(instruments) == "<TallyInstruments timed <Tally checks=9 over_limit=2 store_errors=1>>"
    )


def test_tallies_on_one_provider_are_reported_as_their_sums() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    first, second = Tally(), Tally()
    observe(first, meter_provider=provider)
    observe(second, meter_provider=provider, latency=False)
    first.checks.update(login=2, search=1)
    second.checks.update(login=3)
    second.store_errors = 4
    got = points(reader)
    assert got["ratewarden.checks"] == {"login": 5, "search": 1}
    assert got["ratewarden.store_errors"] == {"": 4}


def test_the_fleet_quotas_are_gauges_by_resource() -> None:
    reader = InMemoryMetricReader()
    statuses = [Status("openai", 600, 900, 600, 580, ("a", "b", "c"))]
    observe(Tally(), meter_provider=MeterProvider(metric_readers=[reader]),
            quotas=lambda: statuses)  # fmt: skip
    got = points(reader)
    assert got["ratewarden.quota.total"] == {"openai": 600}
    assert got["ratewarden.quota.wants"] == {"openai": 900}
    assert got["ratewarden.quota.granted"] == {"openai": 600}
    assert got["ratewarden.quota.used"] == {"openai": 580}
    assert got["ratewarden.quota.members"] == {"openai": 3}
    statuses.clear()  # Redis failed: the last read found none
    assert "ratewarden.quota.total" not in points(reader)
