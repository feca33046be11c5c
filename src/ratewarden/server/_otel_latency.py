"""The service's latency histogram for OpenTelemetry, made from the counts per
bucket that ``/metrics`` keeps (`Metrics.latency`) and added to each export by an
exporter around the configured one (`LatencyAdded`).

OpenTelemetry has no asynchronous histogram, and its synchronous one costs about
4 us a record (the SDK's attribute lookup, lock and exemplar filter): a tenth of a
check in the server. The counts are there already; read when the reader exports,
they cost a check nothing, and carry the bounds ``/metrics`` uses. The histogram is
cumulative from the service's start, whatever temporality the counters are
exported with.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)

from ..otel import METER
from ..rules import LATENCY_BUCKETS

__all__ = ["LatencyAdded"]

NAME = "ratewarden.request.duration"

# each endpoint's count in each bucket of LATENCY_BUCKETS (the last: above them) and sum
Latency = Callable[[], Sequence[tuple[str, Sequence[int], float]]]


class LatencyAdded(MetricExporter):
    """``exporter``, with the histogram of ``latency`` added to the meter
    ``ratewarden``'s metrics in each export."""

    def __init__(self, exporter: MetricExporter, latency: Latency) -> None:
        # the reader asks its exporter for these (the SDK's readers read them so)
        super().__init__(
            preferred_temporality=exporter._preferred_temporality,
            preferred_aggregation=exporter._preferred_aggregation,
        )
        self.exporter = exporter
        self._latency = latency
        self._started = time.time_ns()

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        return self.exporter.export(self.added(metrics_data), timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.exporter.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.exporter.shutdown(timeout_millis, **kwargs)

    def added(self, data: MetricsData) -> MetricsData:
        """``data`` with the histogram among the meter ``ratewarden``'s metrics."""
        histogram = self._histogram()
        if histogram is None:
            return data
        resources = []
        for resource in data.resource_metrics:
            scopes = [
                ScopeMetrics(scope.scope, [*scope.metrics, histogram], scope.schema_url)
                if scope.scope.name == METER else scope
                for scope in resource.scope_metrics
            ]  # fmt: skip
            resources.append(ResourceMetrics(resource.resource, scopes, resource.schema_url))
        return MetricsData(resources)

    def _histogram(self) -> Metric | None:
        now = time.time_ns()
        points = []
        for endpoint, counts, total in self._latency():
            # no minimum or maximum: the counts do not keep them (OTLP's are optional)
            fields: dict[str, Any] = {"min": None, "max": None}
            points.append(HistogramDataPoint(
                attributes={"endpoint": endpoint}, start_time_unix_nano=self._started,
                time_unix_nano=now, count=sum(counts), sum=total, bucket_counts=list(counts),
                explicit_bounds=LATENCY_BUCKETS, **fields,
            ))  # fmt: skip
        if not points:
            return None
        return Metric(
            NAME, "Time to answer a request, by endpoint", "s",
            Histogram(points, AggregationTemporality.CUMULATIVE),
        )  # fmt: skip
