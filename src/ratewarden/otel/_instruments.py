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

A meter provider holds one set of these instruments (its meter keeps the first
instrument of a name and drops the callbacks of any later one): every tally
observed on it is added to the set, and each counter reports their sum.
A Prometheus backend shows them under the names ``/metrics`` uses
(``ratewarden_checks_total``, ``ratewarden_request_duration_seconds``, ...).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Histogram, Meter, MeterProvider, Observation

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


class _Instruments:
    """The instruments on one meter, over every tally observed on its provider."""

    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self.tallies: list[Tally] = []
        self.quotas: Quotas | None = None
        self.duration: Histogram | None = None  # made when a tally is timed
        for name, text, attribute in _RULE_COUNTERS:
            meter.create_observable_counter(
                name, [self._by_rule(attribute)], unit="{request}", description=text
            )
        meter.create_observable_counter(
            "ratewarden.store_errors", [self._store_errors], unit="{request}",
            description="Checks the store could not decide (answered by the failure policy)",
        )  # fmt: skip
        for name, text, attribute in _QUOTA_GAUGES:
            meter.create_observable_gauge(
                name, [self._by_resource(attribute)], unit="{permit}", description=text
            )
        meter.create_observable_gauge(
            "ratewarden.quota.members", [self._by_resource(None)], unit="{member}",
            description="A fleet quota's live members",
        )  # fmt: skip

    def histogram(self) -> Histogram:
        if self.duration is None:
            self.duration = self.meter.create_histogram(
                "ratewarden.request.duration", unit="s",
                description="Time to answer a request (a check, the store call included)",
                explicit_bucket_boundaries_advisory=LATENCY_BUCKETS,
            )  # fmt: skip
        return self.duration

    def _by_rule(self, attribute: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observed(options: CallbackOptions) -> Iterable[Observation]:
            totals: dict[str, int] = {}
            for tally in list(self.tallies):
                counts: dict[str, int] = getattr(tally, attribute)
                # the reader's thread: a copy made in one step while the counting goes on
                for rule, value in list(counts.items()):
                    totals[rule] = totals.get(rule, 0) + value
            return [Observation(value, {"rule": rule}) for rule, value in totals.items()]

        return observed

    def _store_errors(self, options: CallbackOptions) -> Iterable[Observation]:
        if not self.tallies:
            return []
        return [Observation(sum(tally.store_errors for tally in list(self.tallies)))]

    def _by_resource(
        self, attribute: str | None
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observed(options: CallbackOptions) -> Iterable[Observation]:
            if self.quotas is None:
                return []
            return [
                Observation(
                    len(status.members) if attribute is None else getattr(status, attribute),
                    {"resource": status.name},
                )
                for status in self.quotas()
            ]

        return observed


# each meter provider's instruments, for as long as the provider lives
_BY_PROVIDER: weakref.WeakKeyDictionary[MeterProvider, _Instruments] = weakref.WeakKeyDictionary()
_REGISTERING = threading.Lock()


class TallyInstruments:
    """``tally`` among the instruments of a meter provider (`observe`). ``quotas``:
    the fleet quotas' statuses, read when the gauges are collected (it must not
    block: the service hands over what it last read; one a provider);
    ``latency``: `record` feeds the duration histogram (the service leaves it
    out and adds its own to its exports). The counts reported stay in the sums
    for the provider's life: counters never go back."""

    def __init__(
        self, tally: Tally, instruments: _Instruments, *, quotas: Quotas | None = None,
        latency: bool = True,
    ) -> None:  # fmt: skip
        self.tally = tally
        self.duration = instruments.histogram() if latency else None
        # one attribute mapping per endpoint, made once: a check then allocates none
        self._endpoints: dict[str, dict[str, str]] = {}
        instruments.tallies.append(tally)
        if quotas is not None:
            instruments.quotas = quotas

    def record(self, endpoint: str, seconds: float) -> None:
        """One request's time, ``endpoint`` a route's name (``check`` for an engine's);
        nothing without the histogram (``latency=False``)."""
        if self.duration is None:
            return
        attributes = self._endpoints.get(endpoint)
        if attributes is None:
            attributes = self._endpoints[endpoint] = {"endpoint": endpoint}
        self.duration.record(seconds, attributes)

    def __repr__(self) -> str:
        timed = "timed" if self.duration is not None else "not timed"
        return f"<TallyInstruments {timed} {self.tally!r}>"


def observe(
    tally: Tally, *, meter_provider: MeterProvider | None = None, quotas: Quotas | None = None,
    latency: bool = True,
) -> TallyInstruments:  # fmt: skip
    """``tally``'s counts among the instruments of the meter ``ratewarden`` of
    ``meter_provider`` (default: the global one, ``metrics.get_meter_provider()``);
    ``quotas`` and ``latency`` as `TallyInstruments` takes them."""
    provider = metrics.get_meter_provider() if meter_provider is None else meter_provider
    with _REGISTERING:
        instruments = _BY_PROVIDER.get(provider)
        if instruments is None:
            from .. import __version__  # noqa: PLC0415 - read from the package's metadata once

            meter = provider.get_meter(METER, __version__)
            instruments = _BY_PROVIDER[provider] = _Instruments(meter)
        return TallyInstruments(tally, instruments, quotas=quotas, latency=latency)
