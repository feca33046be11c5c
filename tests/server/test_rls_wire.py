"""The RateLimitResponse written by hand (`_rls_wire`) against protobuf's own:
the same message built with protobuf's objects, as the service built it
before, serialises to the same bytes, and protobuf reads ours back as it."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ratewarden.server._protos import messages
from ratewarden.server._rls_wire import UINT32, UNITS, response_bytes
from ratewarden.server._shapes import DescriptorStatus

Response = messages()["RateLimitResponse"]

counts = st.one_of(st.none(), st.integers(0, 2**40))
statuses = st.builds(
    DescriptorStatus,
    st.sampled_from(["OK", "OVER_LIMIT"]),
    st.one_of(st.none(), st.text(max_size=20)),
    counts,
    st.one_of(st.none(), st.sampled_from([*UNITS, 0, 2, 90])),
    counts,
    st.one_of(st.none(), st.floats(-5, 1e7, allow_nan=False)),
)
headers = st.dictionaries(st.text(min_size=1, max_size=20), st.text(max_size=30), max_size=6)


def by_protobuf(allowed: bool, found: list[DescriptorStatus], shown: dict[str, str]) -> Any:
    """The response as protobuf's objects make it (a naive model of the wire)."""
    response = Response(overall_code=1 if allowed else 2)
    for status in found:
        out = response.statuses.add(code=1 if status.code == "OK" else 2)
        if status.requests_per_unit is not None:
            out.current_limit.requests_per_unit = min(status.requests_per_unit, UINT32)
            out.current_limit.unit = UNITS.get(status.unit_seconds or 0, 0)
            out.current_limit.name = status.limit or ""
            out.limit_remaining = min(status.remaining or 0, UINT32)
            if status.reset_after is not None:
                out.duration_until_reset.seconds = math.ceil(status.reset_after)
        elif status.remaining is not None:
            out.limit_remaining = min(status.remaining, UINT32)
    for name, value in shown.items():
        response.response_headers_to_add.add(key=name.lower(), value=value)
    return response


@given(st.booleans(), st.lists(statuses, max_size=5), headers)
def test_the_bytes_are_protobuf_s(
    allowed: bool, found: list[DescriptorStatus], shown: dict[str, str]
) -> None:
    ours = response_bytes(allowed, found, shown.items())
    theirs = by_protobuf(allowed, found, shown)
    assert Response.FromString(ours) == theirs
    assert ours == theirs.SerializeToString()
