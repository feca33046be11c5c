"""The service's latency histogram, kept as plain counts, scrapes as
prometheus-client's own Histogram would for the same observations."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from ratewarden.server._metrics import _BUCKETS, Metrics

NAME = "ratewarden_request_duration_seconds"


def lines(text: bytes) -> list[str]:
    return [line for line in text.decode().splitlines() if line.startswith(NAME)]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["check", "grpc", "auth"]),
            # the buckets' own bounds among them: a bound holds what equals it
            st.one_of(st.sampled_from(_BUCKETS), st.floats(0, 5, allow_nan=False)),
        ),
        max_size=40,
    )
)
def test_the_latency_histogram_scrapes_as_prometheus_client_s(
    observed: list[tuple[str, float]],
) -> None:
    ours = Metrics()
    registry = CollectorRegistry()
    theirs = Histogram(NAME, "Time", ["endpoint"], buckets=_BUCKETS, registry=registry)
    for endpoint, seconds in observed:
        ours.observe(endpoint, seconds)
        theirs.labels(endpoint).observe(seconds)
    expected = [line for line in lines(generate_latest(registry)) if "_created" not in line]
    got = lines(ours.exposition())

    def figures(found: list[str]) -> list[tuple[str, float]]:
        # sums are added in another order: equal to the last bits, not exactly
        return sorted((line.rpartition(" ")[0], round(float(line.rpartition(" ")[2]), 9))
                      for line in found)  # fmt: skip

    assert figures(got) == figures(expected)
