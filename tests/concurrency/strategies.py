"""Lease-table scenarios for the concurrency tests: sequences of operations with
the time between them, kept in one module (see tests/strategies.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

OPS = ("take", "renew", "release", "count", "leave")
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


def queue_steps() -> st.SearchStrategy[list[tuple[Any, ...]]]:
    """Steps with waiters: (gap_us, op, key, lease id, limit, lease_us, priority,
    waits); a step that waits leaves a ticket of two seconds when refused. The
    caller passes each id's place in line back as a client does (``queued_at``
    of its last refusal, until its take is granted or it leaves)."""
    second = 1_000_000
    step = st.tuples(
        st.sampled_from([0, 1, second // 2, 2 * second - 1, 2 * second, 2 * second + 1])
        | st.integers(0, second),
        st.sampled_from(("take", "take", "take", "release", "leave", "count", "renew")),
        st.sampled_from(KEYS),
        st.sampled_from(IDS),
        st.integers(1, 3),
        st.sampled_from([second, 2 * second]),
        st.sampled_from([0, 0, 1, -1, 2**31 - 1, -(2**31) + 1]),
        st.booleans(),
    )
    return st.lists(step, min_size=1, max_size=40)
