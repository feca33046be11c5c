"""`_sync.lua` against the two-tier logic's Python (`force`, then the step), on a real
Redis with the same explicit clock: the same state stored and the same answer. A call
sent again under the id of one applied is, in Python, a call of nothing: no delta
counted, no check made."""

from __future__ import annotations

import struct
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from ratewarden._rate import parse_rate
from ratewarden.algorithms import get_algorithm
from ratewarden.stores.redis import RedisStore
from ratewarden.stores.redis._twotier import LocalLimit, TwoTierSettings, decode, force
from ratewarden.stores.redis.scripts import SYNC, Scripts
from tests.redis_server import LIVE, RedisServer

EPOCH_US = 1_763_700_000_000_000
OPTIONS = {"burst": None, "prefix": "p:", "rule": None, "on_failure": "raise"}

steps = st.lists(
    st.tuples(
        st.integers(0, 3_000_000),  # microseconds since the last step
        st.integers(-3, 40),  # delta
        st.integers(-1, 1),  # its window, relative to now's
        st.integers(0, 5),  # the previous window's delta
        st.integers(0, 12),  # an exact check's cost (0: none)
        st.integers(0, 6),  # a lease asked with it
        st.booleans(),  # the call before, sent again under its id (the rest unused)
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(
    algorithm=st.sampled_from(["fixed_window", "sliding_window_counter", "gcra"]),
    rate=st.sampled_from(["20/second", "7/2second", "100/minute"]),
    script=steps,
)
def test_sync_script_matches_python(
    redis_single: RedisServer, algorithm: str, rate: str, script: list[tuple[int, ...]]
) -> None:
    store = RedisStore(redis_single.url, timeout=LIVE)
    scripts: Scripts = store.scripts
    limit = LocalLimit(get_algorithm(algorithm), parse_rate(rate), OPTIONS, TwoTierSettings())  # type: ignore[arg-type]
    key = f"parity:{uuid.uuid4().hex}"
    now = EPOCH_US
    state = None
    call_id, payload = "", b""
    for gap, sent_delta, window, sent_pdelta, sent_cost, lease, again in script:
        now += gap
        delta, pdelta, cost = sent_delta, sent_pdelta, sent_cost
        if again and call_id:  # applied already: the script counts and checks nothing
            delta = pdelta = cost = 0
        else:
            call_id = f"{{{key}}}:call:{uuid.uuid4().hex}"
            dwin = limit.window(now) + window * limit.params.period if limit.windowed else 0
            payload = struct.pack(">6d", limit.step_id, delta, dwin, pdelta, cost, lease)
            payload += limit.packed
        reply = scripts.call(SYNC, 2, [key, call_id, now, payload, "one", 60_000])
        expected = state
        if delta or pdelta:
            expected = force(limit, expected, now, delta, dwin, pdelta=pdelta)
        allowed, granted = -1, 0
        if cost:
            decision, after = limit.step(expected, now, cost + lease, limit.params)
            if decision.allowed and lease:
                granted = lease
            else:
                decision, after = limit.step(expected, now, cost, limit.params)
            allowed = int(decision.allowed)
            if decision.allowed:
                expected = after
            assert reply[2] == decision.remaining
        assert reply[1] == allowed
        assert reply[6] == granted
        got = decode(reply[5])
        if expected is not None and expected[0] <= now:
            expected = None  # a state already full: the script drops it
        assert got == expected, (got, expected)
        state = got
    store.close()
