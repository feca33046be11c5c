"""`TallyInstruments`: a `Tally`'s counts as OpenTelemetry instruments.

The counters are asynchronous (observable): the meter provider's reader calls
them when it collects, and they read the tally's plain ints then, as ``/metrics``
does when scraped, so a check costs nothing more with OpenTelemetry on. The
latency histogram is the exception: OpenTelemetry has no asynchronous
histogram, so each check records into it (`TallyInstruments.record`, about 4 us
with the SDK). The service leaves it out and adds the histogram its ``/metrics``
keeps to each export instead (`ratewarden.server._otel_latency`).

The instruments and their attributes (each counter's unit is a request):

- ``ratewarden.checks``, ``ratewarden.over_limit``, ``ratewarden.near_limit``,
  ``ratewarden.shadow_over_limit``, ``ratewarden.degraded``: counters, ``rule``;
- ``ratewarden.store_errors``: a counter, no attribute;
- ``ratewarden.request.duration``: a histogram in seconds, ``endpoint``;
- ``ratewarden.quota.total``, ``.wants``, ``.granted``, ``.used``, ``.members``:
  gauges of the fleet quotas, ``resource`` (only when given a reader of them).

An attribute takes a rule's name, a route's or a fleet resource's, all fixed by
the configuration; never a key, which is unbounded and may be personal data.
A Prometheus backend shows them under the names ``/metrics`` uses
(``ratewarden_checks_total``, ``ratewarden_request_duration_seconds``, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

from ..rules import LATENCY_BUCKETS, Tally

__all__ = ["METER", "TallyInstruments", "observe"]

METER = "ratewarden"  # the meter's (instrumentation scope's) name

_RULE_COUNTERS = (
    ("ratewarden.checks", "Requests a rule applied to", "checks"),
    ("ratewarden.over_limit", "Requests a rule denied", "over_limit"),
    ("ratewarden.near_limit", "Requests admitted with 80% or more of the closest limit used",
     "near_limit"),
    ("ratewarden.shadow_over_limit", "Requests a log_only (shadow) rule would have denied",
     "shadow_over_limit"),
    ("ratewarden.degraded", "Requests a degrade rule let through with a level above 0",
     "degraded"),
)  # fmt: skip

_QUOTA_GAUGES = (
    ("ratewarden.quota.total", "A fleet quota's effective total, permits a window",
     "effective_total"),
    ("ratewarden.quota.wants", "Permits a window a fleet quota's members want", "wants"),
    ("ratewarden.quota.granted", "Permits a window a fleet quota's members hold", "granted"),
    ("ratewarden.quota.used", "Permits a fleet quota's members used in their last window",
     "used"),
)  # fmt: skip

Quotas = Callable[[], Sequence[Any]]  # the fleet quotas' statuses (`ratewarden.fleet.QuotaStatus`)


class TallyInstruments:
    """The instruments of ``tally`` on ``meter``; ``quotas``: the fleet quotas'
    statuses, read when the gauges are collected (they must not block: the
    service hands over what it last read); ``latency``: with the duration
    histogram, which `record` feeds (the service adds its own to its exports).
    `close` stops the reports: the OpenTelemetry API cannot take an instrument
    back from its meter."""

    def __init__(
        self, tally: Tally, meter: Meter, *, quotas: Quotas | None = None, latency: bool = True
    ) -> None:
        self.tally = tally
        self.open = True
        self._quotas = quotas
        for name, text, attribute in _RULE_COUNTERS:
            meter.create_observable_counter(
                name, [self._by_rule(attribute)], unit="{request}", description=text
            )
        meter.create_observable_counter(
            "ratewarden.store_errors", [self._store_errors], unit="{request}",
            description="Checks the store could not decide (answered by the failure policy)",
        )  # fmt: skip
        self.duration = None if not latency else meter.create_histogram(
            "ratewarden.request.duration", unit="s",
            description="Time to answer a request (a check, the store call included)",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS,
        )  # fmt: skip
        # one attribute mapping per endpoint, made once: a check then allocates none
        self._endpoints: dict[str, dict[str, str]] = {}
        if quotas is not None:
            for name, text, attribute in _QUOTA_GAUGES:
                meter.create_observable_gauge(
                    name, [self._by_resource(attribute)], unit="{permit}", description=text
                )
            meter.create_observable_gauge(
                "ratewarden.quota.members", [self._by_resource(None)], unit="{member}",
                description="A fleet quota's live members",
            )  # fmt: skip

    def record(self, endpoint: str, seconds: float) -> None:
        """One request's time, ``endpoint`` a route's name (``check`` for an engine's);
        nothing without the histogram (``latency=False``)."""
        if self.duration is None:
            return
        attributes = self._endpoints.get(endpoint)
        if attributes is None:
            attributes = self._endpoints[endpoint] = {"endpoint": endpoint}
        self.duration.record(seconds, attributes)

    def close(self) -> None:
        """Report nothing from now on (the counts stay in the tally)."""
        self.open = False

    def _by_rule(self, attribute: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observed(options: CallbackOptions) -> Iterable[Observation]:
            if not self.open:
                return []
            counts: dict[str, int] = getattr(self.tally, attribute)
            # the reader's thread: a copy made in one step while the counting thread goes on
            return [Observation(value, {"rule": rule}) for rule, value in list(counts.items())]

        return observed

    def _store_errors(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self.tally.store_errors)] if self.open else []

    def _by_resource(
        self, attribute: str | None
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observed(options: CallbackOptions) -> Iterable[Observation]:
            if not self.open or self._quotas is None:
                return []
            return [
                Observation(
                    len(status.members) if attribute is None else getattr(status, attribute),
                    {"resource": status.name},
                )
                for status in self._quotas()
            ]

        return observed

    def __repr__(self) -> str:
        state = "open" if self.open else "closed"
        return f"<TallyInstruments {state} {self.tally!r}>"


def observe(
    tally: Tally, *, meter_provider: MeterProvider | None = None, quotas: Quotas | None = None,
    latency: bool = True,
) -> TallyInstruments:  # fmt: skip
    """``tally``'s counts as instruments of the meter ``ratewarden`` of
    ``meter_provider`` (default: the global one, ``metrics.get_meter_provider()``);
    ``quotas`` and ``latency`` as `TallyInstruments` takes them."""
    return TallyInstruments(tally, meter(meter_provider), quotas=quotas, latency=latency)


def meter(provider: MeterProvider | None) -> Meter:
    from .. import __version__  # noqa: PLC0415 - read from the package's metadata once

    given = metrics.get_meter_provider() if provider is None else provider
    return given.get_meter(METER, __version__)
