"""Lease-table scenarios for the concurrency tests: sequences of operations with
the time between them, kept in one module (see tests/strategies.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

OPS = ("take", "renew", "release", "count")
# a few keys and lease ids, so that operations meet the same leases again
KEYS = ("k1", "k2")
IDS = ("a", "b", "c", "d", "e")


def lease_steps() -> st.SearchStrategy[list[tuple[Any, ...]]]:
    """(gap_us, op, key, lease id, limit, lease_us) steps; gaps of 0 and around a
    lease's length meet expiry edges exactly. Leases of seconds: a Redis set's
    TTL runs on the server's real clock, and must outlast an example."""
    second = 1_000_000
    step = st.tuples(
        st.sampled_from([0, 1, second - 1, second, second + 1, 2 * second + 1])
        | st.integers(0, 5 * second),
        st.sampled_from(OPS),
        st.sampled_from(KEYS),
        st.sampled_from(IDS),
        st.integers(1, 3),
        st.sampled_from([second, 2 * second]),
    )
    return st.lists(step, min_size=1, max_size=40)
