"""OpenTelemetry metrics: the instruments of ``/metrics``, for a meter provider.

    from ratewarden.otel import instrument
    metrics = instrument(engine)                # the global meter provider's, or
    metrics = instrument(engine, meter_provider=provider)
    engine.check({"path": "/api", "user": "u1"})  # counted by rule, timed

``ratewarden serve --otel`` exports the service's own counts over OTLP
(`ratewarden.server`); a library counts an engine's checks with `instrument`,
or exposes any `ratewarden.rules.Tally` with `observe`.

What each module holds: ``_instruments`` (the instruments over a tally, read
when the meter provider collects), ``_engine`` (an engine's checks counted
into a tally of its own).

This package imports the OpenTelemetry API (``pip install ratewarden[otel]``);
``import ratewarden`` does not import it.
"""

from ._engine import EngineMetrics, instrument
from ._instruments import METER, TallyInstruments, observe

__all__ = ["METER", "EngineMetrics", "TallyInstruments", "instrument", "observe"]
