"""The quota service's logic on a fake clock and the in-process coordinator:
what each proxy is assigned, judged by the sum of the rates the proxies are
told (what the upstream would see), not by the members' own bookkeeping."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratewarden.primitives import ConfigurationError, FakeClock
from ratewarden.rlqs import (
    Action,
    LocalCoordinators,
    QuotaService,
    QuotaStream,
    TooManyBuckets,
    Usage,
    bucket_rules,
)
from ratewarden.rules import loads

RULES = """
rlqs:
  - name: api
    domain: envoy
    bucket: {name: api, tenant: "*"}
    rate: 200/second
    algorithm: fair_share
  - name: flat
    domain: envoy
    bucket: {name: flat}
    rate: 90/second
    algorithm: equal
    lease: 2
    abandon_after: 10
"""


def service(text: str = RULES, max_buckets: int = 10_000) -> tuple[QuotaService, FakeClock]:
    clock = FakeClock()
    rules = bucket_rules(loads(text).file.rlqs)
    coordinators = LocalCoordinators(clock)
    return QuotaService(rules, coordinators, clock=clock, max_buckets=max_buckets), clock


T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


API = {"name": "api", "tenant": "acme"}


def rate_of(actions: Sequence[Action], bucket: dict[str, str] = API) -> float:
    key = tuple(sorted(bucket.items()))
    [action] = [a for a in actions if a.bucket == key]
    assert action.kind == "assign"
    assert action.assignment is not None
    if action.assignment.kind == "deny":
        return 0.0
    return action.assignment.per_second


async def rounds(
    streams: list[QuotaStream],
    clock: FakeClock,
    demand: list[int],
    n: int,
    bucket: dict[str, str] = API,
) -> list[float]:
    """``n`` reporting intervals of a second, each stream reporting ``demand``
    requests (allowed up to its rate); the rates told in the last."""
    rates = [0.0] * len(streams)
    for _ in range(n):
        clock.advance(1.0)
        for i, stream in enumerate(streams):
            allowed = min(demand[i], int(rates[i]))
            actions = await stream.report("envoy", [Usage(bucket, allowed, demand[i] - allowed)])
            rates[i] = rate_of(actions, bucket)
    return rates


def test_fair_share_gives_light_proxies_their_demand_and_the_heavy_one_the_rest() -> None:
    svc, clock = service()

    async def go() -> list[float]:
        streams = [svc.open() for _ in range(3)]
        for s in streams:
            await s.report("envoy", [Usage(API, 1, 0)])
        return await rounds(streams, clock, [250, 25, 25], 6)

    heavy, light1, light2 = run(go())
    assert light1 >= 25
    assert light2 >= 25
    assert heavy + light1 + light2 <= 200
    assert heavy + light1 + light2 >= 190  # what is left goes to the heavy one


def test_the_rates_told_never_sum_past_the_total_while_proxies_join() -> None:
    svc, clock = service()

    async def go() -> None:
        streams: list[QuotaStream] = []
        told: dict[int, float] = {}
        for step in range(12):
            if step < 4:
                stream = svc.open()
                n = len(streams)
                stream.on_push = lambda actions, n=n: told.__setitem__(n, rate_of(actions))
                streams.append(stream)
            clock.advance(0.25)
            for i, s in enumerate(streams):
                actions = await s.report("envoy", [Usage(API, 100, 100)])
                told[i] = rate_of(actions)
                assert sum(told.values()) <= 200 + 1e-9

    run(go())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 400), st.sampled_from([0.1, 0.5, 1.0, 3.0])),
        min_size=1,
        max_size=60,
    )
)
def test_whatever_the_reports_the_rates_told_in_force_never_pass_the_total(
    steps: list[tuple[int, int, float]],
) -> None:
    """A proxy enforces what it was told last until its time to live ends: the
    sum of those still in force never passes the total."""
    svc, clock = service()

    async def go() -> None:
        streams = [svc.open() for _ in range(6)]
        told: dict[int, tuple[float, int]] = {}  # rate, until (ms)

        def tell(who: int, actions: Sequence[Action]) -> None:
            [action] = actions
            assert action.ttl is not None
            told[who] = (rate_of(actions), svc.now_ms() + action.ttl * 1000)

        for i, stream in enumerate(streams):
            stream.on_push = lambda actions, i=i: tell(i, actions)
        for who, demand, gap in steps:
            clock.advance(gap)
            now = svc.now_ms()
            actions = await streams[who].report(
                "envoy", [Usage(API, demand // 2, demand - demand // 2)]
            )
            tell(who, actions)
            in_force = sum(rate for rate, until in told.values() if until > now)
            assert in_force <= 200 + 1e-9

    run(go())


def test_a_proxy_that_is_gone_keeps_its_share_until_its_lease_then_the_others_get_it() -> None:
    svc, clock = service()

    async def go() -> None:
        flat = {"name": "flat"}
        a, b = svc.open(), svc.open()
        await rounds([a, b], clock, [100, 100], 4, flat)
        a.close()
        clock.advance(1.0)
        rate = rate_of(await b.report("envoy", [Usage(flat, 45, 55)]), flat)
        assert rate == pytest.approx(45, abs=0.5)  # the lease (2 s) still holds a's half
        clock.advance(1.5)
        # a's lease is over; a share that lapsed may still be spent until every
        # member has reported once more, so b is held to what it had for one report
        rate = rate_of(await b.report("envoy", [Usage(flat, 45, 55)]), flat)
        assert rate == pytest.approx(45, abs=0.5)
        clock.advance(1.0)
        rate = rate_of(await b.report("envoy", [Usage(flat, 45, 55)]), flat)
        assert rate == pytest.approx(90, abs=0.5)

    run(go())


def test_a_stream_that_ends_gives_its_share_to_the_others_when_its_last_assignment_ends() -> None:
    """Its proxy spends its share until its assignment's ttl (1 s for a 2 s
    lease): then it leaves, and the others here are sent more, within the lease."""
    svc, clock = service()
    flat = {"name": "flat"}

    async def main() -> tuple[float, list[float]]:
        a, b = svc.open(), svc.open()
        pushed: list[float] = []
        b.on_push = lambda actions: pushed.append(rate_of(actions, flat))
        await rounds([a, b], clock, [100, 100], 3, flat)
        before = rate_of(await b.report("envoy", [Usage(flat, 45, 55)]), flat)
        await asyncio.sleep(0.1)  # the rebalance of the two joining is done
        pushed.clear()
        a.close()
        await asyncio.sleep(0.2)
        assert pushed == []  # a's proxy still spends until its ttl ends
        await asyncio.sleep(2.0)  # its ttl (1 s of the fake clock, waited in real time) + 0.5 s
        return before, pushed

    before, pushed = run(main())
    assert before == pytest.approx(45, abs=0.5)
    assert pushed == [pytest.approx(90, abs=0.5)]
    assert svc.stats.buckets == 1


def test_reports_closer_than_half_a_second_make_one_refresh_and_lose_no_count() -> None:
    """A client that floods reports costs no coordinator call per report: the
    early ones are answered with what the proxy holds, and their requests
    count toward the next refresh's demand."""
    svc, clock = service()
    calls: list[str] = []
    refresh = svc.coordinators.refresh

    async def counted(*args: Any) -> Any:
        calls.append(args[0])
        return await refresh(*args)

    svc.coordinators.refresh = counted  # type: ignore[method-assign, assignment]

    async def main() -> float:
        stream = svc.open()
        await stream.report("envoy", [Usage(API, 1, 0)])
        clock.advance(1.0)
        first = rate_of(await stream.report("envoy", [Usage(API, 10, 0)]))
        for _ in range(100):  # 100 reports in 0.4 s, one request each
            clock.advance(0.004)
            assert rate_of(await stream.report("envoy", [Usage(API, 1, 0)])) == first
        clock.advance(0.6)
        await stream.report("envoy", [Usage(API, 0, 0)])
        status = await svc.coordinators.show("rlqs/envoy/name:api/tenant:acme")
        assert status is not None
        return status.members[0].wants

    wants = run(main())
    assert len(calls) == 3  # the first report, the second, and the one after the flood
    # the flood's 100 requests over its second, counted whole: 100 a second, and
    # a tenth more and one as headroom
    assert wants == pytest.approx(111, abs=0.01)


def test_a_ttl_ends_before_the_lease() -> None:
    svc, _ = service()

    async def go() -> Action:
        [action] = await svc.open().report("envoy", [Usage({"name": "flat"}, 1, 0)])
        return action

    action = run(go())
    assert action.ttl is not None
    assert 0 < action.ttl < 2.0


def test_a_bucket_no_entry_matches_is_allowed_without_a_limit() -> None:
    svc, _ = service()
    [action] = run(svc.open().report("envoy", [Usage({"name": "other"}, 3, 0)]))
    assert action.assignment is not None
    assert action.assignment.kind == "allow"
    assert action.ttl == 60  # Envoy 1.40 ends an assignment without one at once
    assert svc.stats.unmatched == 1
    [action] = run(svc.open().report("elsewhere", [Usage(API, 3, 0)]))
    assert action.assignment is not None
    assert action.assignment.kind == "allow"


def test_the_domain_comes_first_and_does_not_change() -> None:
    svc, _ = service()
    stream = svc.open()
    with pytest.raises(ConfigurationError, match="names its domain"):
        run(stream.report("", [Usage(API, 1, 0)]))
    run(stream.report("envoy", [Usage(API, 1, 0)]))
    run(stream.report("", [Usage(API, 1, 0)]))  # later reports may leave it out
    with pytest.raises(ConfigurationError, match="new stream"):
        run(stream.report("other", [Usage(API, 1, 0)]))


def test_an_idle_bucket_is_abandoned_after_abandon_after() -> None:
    svc, clock = service()
    flat = {"name": "flat"}
    stream = svc.open()

    async def go() -> list[Action]:
        await stream.report("envoy", [Usage(flat, 1, 0)])
        for _ in range(9):
            clock.advance(1.0)
            [action] = await stream.report("envoy", [Usage(flat, 0, 0)])
            assert action.kind == "assign"
        clock.advance(1.0)
        return await stream.report("envoy", [Usage(flat, 0, 0)])

    [action] = run(go())
    assert action.kind == "abandon"
    assert svc.stats.abandoned == 1
    assert svc.stats.buckets == 0


def test_buckets_past_the_bound_push_out_the_least_recently_reported() -> None:
    svc, _ = service(max_buckets=8)

    async def go() -> list[Action]:
        streams = [svc.open() for _ in range(5)]
        for i in range(8):
            await streams[i % 4].report("envoy", [Usage({"name": "api", "tenant": f"t{i}"}, 1, 0)])
        assert svc.stats.buckets == 8
        # t0 is reported again by its holder: the least recent is t1 now
        await streams[0].report("envoy", [Usage({"name": "api", "tenant": "t0"}, 1, 0)])
        await streams[4].report("envoy", [Usage({"name": "api", "tenant": "new"}, 1, 0)])
        assert svc.stats.buckets == 8
        assert svc.stats.evicted == 1
        # t1 (stream 1's) was pushed out: stream 1 is told to abandon it
        return await streams[1].report("envoy", [Usage({"name": "api", "tenant": "t1"}, 1, 0)])

    actions = run(go())
    assert [a.kind for a in actions] == ["abandon"]
    assert actions[0].bucket == (("name", "api"), ("tenant", "t1"))


def test_one_stream_holds_at_most_a_quarter_of_the_buckets() -> None:
    svc, _ = service(max_buckets=8)
    stream = svc.open()
    run(stream.report("envoy", [Usage({"name": "api", "tenant": f"t{i}"}, 1, 0) for i in range(2)]))
    with pytest.raises(TooManyBuckets, match="at most 2 buckets"):
        run(stream.report("envoy", [Usage({"name": "api", "tenant": "t3"}, 1, 0)]))


def test_a_reload_puts_a_new_total_in_force_at_the_next_report() -> None:
    svc, clock = service()

    async def go() -> float:
        stream = svc.open()
        await rounds([stream], clock, [500], 3)
        await svc.use(bucket_rules(loads(RULES.replace("200/second", "50/second")).file.rlqs))
        return (await rounds([stream], clock, [500], 1))[0]

    assert run(go()) == pytest.approx(50, abs=0.5)


def test_a_reload_that_drops_the_entry_has_the_proxies_abandon_the_bucket() -> None:
    svc, clock = service()

    async def go() -> list[Action]:
        stream = svc.open()
        await rounds([stream], clock, [10], 2)
        await svc.use(
            bucket_rules(
                loads(
                    RULES.split("  - name: flat", maxsplit=1)[0].replace("{name: api", "{name: web")
                ).file.rlqs
            )
        )
        return await stream.report("envoy", [Usage(API, 1, 0)])

    actions = run(go())
    assert [a.kind for a in actions] == ["abandon"]


def test_a_proxy_whose_demand_rises_gets_its_share_before_the_others_report() -> None:
    """A light proxy's demand grows while a busy one holds the rest: the busy
    one is sent a smaller assignment at once, and the light one its share,
    without waiting for the busy one's next report (5 s apart in Envoy 1.40)."""
    svc, clock = service()

    async def main() -> list[float]:
        busy, light = svc.open(), svc.open()
        pushed: list[float] = []
        light.on_push = lambda actions: pushed.append(rate_of(actions))
        await rounds([busy, light], clock, [400, 25], 3)
        await asyncio.sleep(1.2)  # the joins' rebalance, and its once-a-second wait
        pushed.clear()
        clock.advance(1.0)
        # 35 a second: past its grant, though not twice it
        told = rate_of(await light.report("envoy", [Usage(API, 28, 7)]))
        await asyncio.sleep(0.2)
        return [told, *pushed]

    told, *pushed = run(main())
    assert told < 35  # the busy proxy still holds the rest
    assert pushed == [pytest.approx(39.5, abs=0.5)]  # 35 a second, a tenth more and one
