"""``ratewarden serve --otel``: the service's counts exported over OTLP, as well as
served at ``/metrics``, configured the standard way, by the ``OTEL_*`` environment.

The counters read the service's one `Tally` when the SDK's periodic reader collects
(every ``OTEL_METRIC_EXPORT_INTERVAL`` ms, 60000 by default), and the latency
histogram is the one ``/metrics`` keeps, added to each export
(`ratewarden.server._otel_latency`): nothing more on a check's path. The
fleet quotas' gauges read what a task on the event loop last read from Redis
(once an interval): the reader's thread must not wait on Redis.

Which exporter (``OTEL_METRICS_EXPORTER``): ``otlp`` (the default) over HTTP with
protobuf, to ``OTEL_EXPORTER_OTLP_ENDPOINT`` (``http://localhost:4318``) or
``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``; or ``console`` (JSON on stdout, for a
look). The resource: ``service.name`` ``ratewarden`` unless ``OTEL_SERVICE_NAME``
or ``OTEL_RESOURCE_ATTRIBUTES`` say otherwise. Imported only with ``--otel``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..primitives import ConfigurationError

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider

    from ._service import Service

__all__ = ["EXPORTERS", "OtelExport", "available", "check_environment"]

log = logging.getLogger("ratewarden.server")

EXPORTERS = ("otlp", "console")
_PROTOCOLS = ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_INTERVAL_MS = 60_000.0  # the SDK's default export interval
STOP_TIMEOUT = 3.0  # seconds the last export may take when the service stops


def available() -> bool:
    """Whether the otel extra's packages are installed."""
    try:
        import opentelemetry.exporter.otlp.proto.http.metric_exporter  # noqa: PLC0415
        import opentelemetry.sdk.metrics  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


def check_environment(environ: Mapping[str, str] = os.environ) -> str:
    """The exporter ``OTEL_METRICS_EXPORTER`` asks for; `ConfigurationError` for one
    this service does not ship, or an OTLP protocol other than HTTP's protobuf."""
    exporter = environ.get("OTEL_METRICS_EXPORTER", "").strip().lower() or "otlp"
    if exporter not in EXPORTERS:
        raise ConfigurationError(
            f"--otel: OTEL_METRICS_EXPORTER={exporter} is not one this service ships; "
            f"give {' or '.join(EXPORTERS)} (/metrics serves Prometheus anyway)"
        )
    if exporter == "otlp":
        for name in _PROTOCOLS:
            protocol = environ.get(name, "").strip().lower()
            if protocol and protocol != "http/protobuf":
                raise ConfigurationError(
                    f"--otel: {name}={protocol}: the otel extra exports OTLP over "
                    "http/protobuf only"
                )
    return exporter


def _interval(environ: Mapping[str, str]) -> float:
    """Seconds between exports, as the SDK reads them (a bad value: its default)."""
    try:
        milliseconds = float(environ.get("OTEL_METRIC_EXPORT_INTERVAL", _INTERVAL_MS))
    except ValueError:
        milliseconds = _INTERVAL_MS
    return (milliseconds if milliseconds > 0 else _INTERVAL_MS) / 1000


class OtelExport:
    """The service's counts on a meter provider of its own with a periodic
    exporting reader, made from the environment, from `start` on."""

    def __init__(self, service: Service, environ: Mapping[str, str] = os.environ) -> None:
        self.service = service
        self.exporter = check_environment(environ)
        self.interval = _interval(environ)
        self.provider: MeterProvider | None = None
        self._quotas: Sequence[Any] = ()  # the fleet quotas the last read found
        self._reading: asyncio.Task[None] | None = None

    def start(self) -> None:
        from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader  # noqa: PLC0415
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource  # noqa: PLC0415

        from ..otel import observe  # noqa: PLC0415
        from ._otel_latency import LatencyAdded  # noqa: PLC0415

        exporter: Any
        if self.exporter == "console":
            from opentelemetry.sdk.metrics.export import ConsoleMetricExporter  # noqa: PLC0415

            exporter = ConsoleMetricExporter()
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # noqa: PLC0415
                OTLPMetricExporter,
            )

            exporter = OTLPMetricExporter()  # endpoint, headers, timeout: OTEL_EXPORTER_OTLP_*
        service = self.service
        exporter = LatencyAdded(exporter, service.metrics.latency)
        resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = Resource.create({SERVICE_NAME: "ratewarden"})
        self.provider = MeterProvider(
            metric_readers=[PeriodicExportingMetricReader(exporter)], resource=resource
        )
        quotas = None if service.quotas is None else self.last_quotas
        # the latency histogram is the exporter's (LatencyAdded): a check records nothing
        observe(service.counters.tally, meter_provider=self.provider, quotas=quotas, latency=False)
        if service.quotas is not None:
            self._reading = asyncio.get_running_loop().create_task(self._read_quotas())
        log.info("OpenTelemetry: exporting the metrics (%s) every %gs", self.exporter,
                 self.interval)  # fmt: skip

    def last_quotas(self) -> Sequence[Any]:
        return self._quotas

    async def _read_quotas(self) -> None:
        reader = self.service.quotas
        assert reader is not None
        while True:
            self._quotas = await reader.gauges()  # none when Redis fails, logged
            await asyncio.sleep(self.interval)

    async def aclose(self, timeout: float = STOP_TIMEOUT) -> None:
        """Export what was counted since the last export, then stop, within
        ``timeout`` seconds: the exporter retries a collector that does not
        answer for up to OTEL_EXPORTER_OTLP_TIMEOUT (10 s), and a stopping
        service should not wait that long on it."""
        if self._reading is not None:
            self._reading.cancel()
        if self.provider is not None:
            await asyncio.to_thread(self.provider.shutdown, timeout_millis=timeout * 1000)

    def __repr__(self) -> str:
        return f"<OtelExport {self.exporter} every {self.interval:g}s>"
