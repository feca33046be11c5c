"""FleetQuota and AsyncFleetQuota on a real Redis: joining, sharing, leaving,
dying, changes of the total, Redis losing the resource or going away."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from ratewarden import ConfigurationError, FakeClock, RateLimitTimeout
from ratewarden.fleet import AsyncFleetQuota, FleetQuota, QuotaConfig, set_quota
from ratewarden.fleet.coordinator import Reply
from ratewarden.fleet.member import Member
from ratewarden.integrations.httpx import RateLimitTransport
from ratewarden.stores.redis.connection import connect
from tests.fleet.members import blocking_member, member
from tests.redis_server import RedisCluster, RedisServer, free_port

START = 1_763_900_000.0


def test_members_split_the_total_and_spend_locally(client: redis.Redis, name: str) -> None:
    clock = FakeClock(START)
    config = QuotaConfig("10/second", "equal")
    a = member(name, client, clock, "a", config=config).start()
    b = member(name, client, clock, "b").start()
    assert b.grant == 0.0  # a holds the whole total until it hears of b
    a.refresh()
    b.refresh()
    assert (a.grant, b.grant) == (5.0, 5.0)
    clock.advance(1.0)  # the windows the grants apply from
    assert sum(a.try_acquire() for _ in range(10)) == 5
    assert sum(b.try_acquire() for _ in range(10)) == 5
    with pytest.raises(RateLimitTimeout):
        a.acquire(0)
    a.acquire(1.0)  # waits (on the fake clock) for the next window
    b.close()
    status = a.status()  # on the fake clock: show_quota would read Redis's own
    assert status is not None
    assert [m.id for m in status.members] == ["a"]  # b left: its share is free at once
    a.refresh()
    assert a.grant == 10.0


@pytest.mark.parametrize(
    ("giver_paced", "taker_paced"), [(True, True), (True, False), (False, True)]
)
def test_space_given_up_mid_window_is_taken_up_from_the_next_edge(
    client: redis.Redis, name: str, giver_paced: bool, taker_paced: bool
) -> None:
    """Mid-window, a joiner takes what the first member gives up from the next
    window edge, paced or not: the giver may have spent that space's permits of
    this window already, and a window with both would pass the total."""
    clock = FakeClock(START + 0.25)
    config = QuotaConfig("10/second", "equal")
    a = member(name, client, clock, "a", config=config, pace=giver_paced).start()
    b = member(name, client, clock, "b", pace=taker_paced).start()
    assert (a.grant, b.grant) == (10.0, 0.0)
    a.refresh()  # gives up half, at once
    clock.advance(0.05)
    b.refresh()
    assert b.local_status()["pending"] == 5.0
    spent = 0
    for _ in range(40):  # the rest of the window (0.7 s), a caller every 17.5 ms
        spent += b.try_acquire()
        clock.advance(0.0175)
    assert spent == 0
    clock.set(START + 1.25)  # the next window: a grant waiting for its edge applies
    assert b.local_status()["pending"] is None
    assert b.try_acquire()


def test_a_small_move_between_running_paced_members_waits_for_the_edge(
    client: redis.Redis, name: str
) -> None:
    """Only a member that had less than half of its new grant (one that joins)
    takes given-up space at once: for the small moves of a running fleet, the
    slots the giver's callers reserved at its old rate would add up."""
    clock = FakeClock(START + 0.25)
    config = QuotaConfig("10/second", "fair_share")
    a = member(name, client, clock, "a", config=config, pace=True).start()
    b = member(name, client, clock, "b", pace=True).start()
    a.demand(2)
    b.demand(8)
    for _ in range(3):
        clock.advance(1.0)
        b.refresh()
        a.refresh()
    assert (a.grant, b.grant) == (2.0, 8.0)
    a.demand(3)
    b.demand(7)
    b.refresh()  # gives up a permit, at once
    a.refresh()
    assert a.local_status()["pending"] is not None  # from the next window edge


def test_a_quota_that_does_not_exist_is_a_clear_error(client: redis.Redis, name: str) -> None:
    with pytest.raises(ConfigurationError, match="ratewarden quota set"):
        member(name, client, FakeClock(START), "a").start()


def test_fair_share_follows_demand(client: redis.Redis, name: str) -> None:
    clock = FakeClock(START)
    config = QuotaConfig("100/second", "fair_share", refresh=1.0)
    busy = member(name, client, clock, "busy", config=config).start()
    quiet = member(name, client, clock, "quiet").start()
    for _ in range(4):  # busy asks 300 a second, quiet 10
        for _ in range(300):
            busy.try_acquire()
        for _ in range(10):
            quiet.try_acquire()
        clock.advance(1.0)
        busy.refresh()
        quiet.refresh()
    assert quiet.grant == pytest.approx(10, abs=0.5)
    assert busy.grant == pytest.approx(90, abs=0.5)


def test_a_dead_members_share_is_reclaimed_after_its_lease(client: redis.Redis, name: str) -> None:
    clock = FakeClock(START)
    config = QuotaConfig("10/second", "equal", refresh=1.0, lease=3.0)
    a = member(name, client, clock, "a", config=config).start()
    member(name, client, clock, "dies").start()  # never refreshes again, never leaves
    a.refresh()
    assert a.grant == 5.0
    clock.advance(2.9)
    a.refresh()
    assert a.grant == 5.0
    clock.advance(0.2)  # the dead member's lease is over
    a.refresh()
    assert a.grant == 10.0


def test_a_cut_reaches_a_running_member_by_pubsub(client: redis.Redis, name: str) -> None:
    config = QuotaConfig("1000/second", "equal", refresh=5.0, lease=15.0)
    with FleetQuota(name, client, config=config, member_id="a") as a:
        assert a.grant == 1000.0
        time.sleep(0.2)  # the refresh thread subscribes
        started = time.monotonic()
        set_quota(client, name, config.but(rate="400/second"))
        while a.grant != 400.0 and time.monotonic() - started < 2.0:
            time.sleep(0.005)
        took = time.monotonic() - started
        assert a.grant == 400.0
        assert took < 1.0  # long before the 5 s refresh


def test_a_cut_never_leaves_more_held_than_the_total(client: redis.Redis, name: str) -> None:
    clock = FakeClock(START)
    config = QuotaConfig("90/second", "equal")
    members = [member(name, client, clock, f"m{i}", config=config).start() for i in range(3)]
    for m in members:
        m.refresh()
    assert sum(m.grant for m in members) == 90
    members[0].coordinator.set(config.but(rate="30/second"))  # on the fake clock
    status = members[0].status()
    assert status is not None
    assert status.granted <= 30
    assert len(status.members) == 3


def test_redis_restarted_empty_is_rebuilt_without_exceeding(client: redis.Redis, name: str) -> None:
    clock = FakeClock(START)
    config = QuotaConfig("10/second", "equal", refresh=1.0, lease=3.0)
    a = member(name, client, clock, "a", config=config).start()
    b = member(name, client, clock, "b").start()
    a.refresh()
    client.delete(f"{{rw:quota:{name}}}:cfg", f"{{rw:quota:{name}}}:members")
    clock.advance(1.0)
    a.refresh()  # the resource comes back from what a knew; a alone asks for no more
    assert a.grant == 5.0
    b.refresh()
    assert a.grant + b.grant <= 10
    for _ in range(4):  # a lease later, the rebuild is over
        clock.advance(1.0)
        a.refresh()
        b.refresh()
        assert a.grant + b.grant <= 10
    assert (a.grant, b.grant) == (5.0, 5.0)


def test_redis_gone_keeps_the_grant_for_a_lease_then_the_safe_share(
    client: redis.Redis, name: str
) -> None:
    clock = FakeClock(START)
    config = QuotaConfig("12/second", "fair_share", refresh=1.0, lease=3.0, safe=2)
    a = member(name, client, clock, "a", config=config).start()
    for _ in range(12):
        a.try_acquire()
    clock.advance(1.0)
    a.refresh()
    assert a.grant == 12.0
    a.coordinator.client = connect(f"redis://127.0.0.1:{free_port()}/0", 0.05)
    for _ in range(2):
        clock.advance(1.0)
        with pytest.raises(Exception, match="coordination failed"):
            a.refresh()
        assert a.grant == 12.0  # within its lease
    clock.advance(1.5)
    with pytest.raises(Exception, match="coordination failed"):
        a.refresh()
    assert a.grant == 2.0  # the safe share


def test_httpx_transport_takes_permits_from_a_fleet_quota(client: redis.Redis, name: str) -> None:
    clock = FakeClock(START)
    quota = member(name, client, clock, "a", config=QuotaConfig("3/second", "equal")).start()
    sent: list[str] = []

    def provider(request: httpx.Request) -> httpx.Response:
        sent.append(str(request.url))
        return httpx.Response(429 if len(sent) == 3 else 200)

    transport = RateLimitTransport(quota, httpx.MockTransport(provider), max_wait=0)
    with httpx.Client(transport=transport) as http:
        statuses = [http.get(f"https://a{i}.example/").status_code for i in range(3)]
        with pytest.raises(RateLimitTimeout):
            http.get("https://other.example/")  # one pool for every host
    assert statuses == [200, 200, 429]
    assert quota._member.throttled == 1  # the 429 was reported to the quota


def test_async_twin(redis_single: RedisServer, name: str) -> None:
    async def main() -> None:
        async with aioredis.Redis(port=redis_single.port) as c:
            clock = FakeClock(START)
            options = {"clock": clock, "coordinator_clock": clock, "background": False}
            config = QuotaConfig("4/second", "equal")
            a = await AsyncFleetQuota(name, c, config=config, member_id="a", **options).start()  # type: ignore[arg-type]
            b = await AsyncFleetQuota(name, c, member_id="b", **options).start()  # type: ignore[arg-type]
            await a.refresh()
            await b.refresh()
            assert (a.grant, b.grant) == (2.0, 2.0)
            clock.advance(1.0)
            await a.acquire(0)
            await a.acquire(0)
            with pytest.raises(RateLimitTimeout):
                await a.acquire(0)
            async with a.slot(max_wait=2.0):
                pass
            await b.aclose()
            status = await a.status()
            assert status is not None
            assert [m.id for m in status.members] == ["a"]
            await a.aclose()

    asyncio.run(main())


def test_a_message_of_a_cut_shrinks_the_grant_before_any_refresh() -> None:
    clock = FakeClock(START)
    m = Member("push-api", clock, member_id="a")
    m.share.apply(600_000, 1_000_000, ((0, 600_000),), clock.time_ns(), settled=True)
    assert m.on_message(b"2 400000 1000000")
    assert m.grant == 240.0
    assert not m.on_message(b"garbage")


def test_on_a_redis_cluster(redis_6_nodes: RedisCluster, name: str) -> None:
    """The resource's keys share a hash tag: one node holds it, and a cut made
    there reaches members subscribed through any node."""
    config = QuotaConfig("100/second", "equal", refresh=5.0, lease=15.0)
    with (
        FleetQuota(name, redis_6_nodes.url, config=config, member_id="a") as a,
        FleetQuota(name, redis_6_nodes.url, member_id="b") as b,
    ):
        a.refresh()
        b.refresh()
        assert (a.grant, b.grant) == (50.0, 50.0)
        time.sleep(0.2)  # the refresh threads subscribe
        set_quota(a.client, name, config.but(rate="40/second"))
        started = time.monotonic()
        while (a.grant, b.grant) != (20.0, 20.0) and time.monotonic() - started < 2.0:
            time.sleep(0.005)
        assert (a.grant, b.grant) == (20.0, 20.0)


def reply_of(grant: int, held: int, pieces: tuple[tuple[int, int], ...], *, eff: int) -> Reply:
    fields = {**QuotaConfig("1000/second", "fair_share").fields(), "eff_m": str(eff)}
    return Reply(grant, held, pieces, 1, round(START * 1000), fields)


def test_a_cut_heard_twice_is_applied_once() -> None:
    """A refresh's reply may bring the cut before the channel's message does (or
    after it): the member's pieces shrink once, whichever comes first."""
    clock = FakeClock(START)
    for order in ("reply first", "message first"):
        m = Member("push-api", clock, member_id="a")
        m.on_reply(reply_of(600_000, 1_000_000, ((400_000, 600_000),), eff=1_000_000), 0)
        cut = reply_of(240_000, 400_000, ((160_000, 240_000),), eff=400_000)
        if order == "reply first":
            m.on_reply(cut, 0)
            m.on_message(b"2 400000 1000000")
        else:
            m.on_message(b"2 400000 1000000")
            m.on_reply(cut, 0)
        assert m.share.pieces == ((160_000, 240_000),), order
        assert m.grant == 240.0, order


def test_an_application_states_its_demand(client: redis.Redis, name: str) -> None:
    """A queue consumer that knows its lag says what it wants (``demand``, or a
    ``wants`` function asked at each refresh) rather than being measured."""
    clock = FakeClock(START)
    config = QuotaConfig("100/second", "fair_share", refresh=1.0)
    lag = {"permits": 70.0}
    told = member(name, client, clock, "told", config=config, wants=lambda: lag["permits"])
    told.start()
    fixed = member(name, client, clock, "fixed").start()
    fixed.demand(20)
    for _ in range(2):
        clock.advance(1.0)
        told.refresh()
        fixed.refresh()
    status = told.status()
    assert status is not None
    assert {m.id: m.wants for m in status.members} == {"told": 70.0, "fixed": 20.0}
    lag["permits"] = 1e9  # more than anyone can have: the total
    fixed.demand(None)  # measured again: it asked for nothing
    clock.advance(1.0)
    told.refresh()
    fixed.refresh()
    status = told.status()
    assert status is not None
    assert {m.id: m.wants for m in status.members} == {"told": 100.0, "fixed": 0.0}
    with pytest.raises(ConfigurationError, match="demand"):
        fixed.demand(-1)
    with pytest.raises(ConfigurationError, match="wants"):
        member(name, client, clock, "bad", wants=5)


def test_a_bad_wants_function_falls_back_to_what_is_measured(
    client: redis.Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(START)
    config = QuotaConfig("100/second", "fair_share", refresh=1.0)

    def broken() -> float:
        raise RuntimeError("lag unknown")

    a = member(name, client, clock, "a", config=config, wants=broken).start()
    for _ in range(30):
        a.try_acquire()
    clock.advance(1.0)
    a.refresh()
    status = a.status()
    assert status is not None
    assert status.members[0].wants == 30.0
    assert "the wants function failed" in caplog.text


# Two members in two processes, as two instances of a service are: in one
# process, the GIL and the machine's other work decided how fast each member's
# threads woke (seen in a clean clone's serial pass: 306 against 214 served), and
# the coordinator rightly gives a member that asks less the rest. The band is 25%:
# a coordinator that shared by callers rather than by members would split 3 to 1.
@pytest.mark.serial
def test_blocking_threads_are_served_alike_by_a_real_coordinator(
    redis_single: RedisServer, name: str
) -> None:
    """Two members, one with 6 threads blocking in acquire and one with 2, on
    real time and a real Redis: each thread asks again as soon as it is served,
    so each member's callers hide their demand but for how long they wait.
    What each is served over the last seconds splits the total evenly."""
    import multiprocessing  # noqa: PLC0415 - only this test runs processes

    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    start = time.time() + 5.0  # both processes up and joined by then
    # settle 3 s (a few refreshes), then count 6 s. Two processes serve 100.6-100.7% of
    # the total (1207-1208 of 1200 over 6 s of wall clock, 8 runs): the floor here is
    # 95%. A refresh whose period covers the paced margins around a window's edge must
    # not read the member of two threads as wanting a fraction of its grant
    # (test_share.py): when it did, about 100 permits a time were lost, and two
    # processes served 89%
    counted = 6.0
    times = (start, start + 3.0, start + 3.0 + counted)
    processes = [
        context.Process(target=blocking_member,
                        args=((redis_single.url, name), f"m{i}", threads, times, out))
        for i, threads in enumerate((6, 2))
    ]  # fmt: skip
    for process in processes:
        process.start()
    try:
        served = dict(out.get(timeout=30) for _ in processes)
    finally:
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.kill()
    assert served["m0"] + served["m1"] >= 0.95 * 200 * counted, served
    assert served["m0"] == pytest.approx(served["m1"], rel=0.25), served


def test_a_thread_or_task_made_for_each_call_is_a_new_caller() -> None:
    """A caller is its thread or task object, not its number: a thread started
    for each call often gets a finished one's number, and would read as that
    one coming back after waiting (a demand it does not have)."""
    import threading  # noqa: PLC0415 - only these tests run threads

    from ratewarden.fleet._line import current_caller  # noqa: PLC0415

    seen: list[object] = []
    for _ in range(2):
        thread = threading.Thread(target=lambda: seen.append(current_caller()))
        thread.start()
        thread.join()
    assert seen[0] is not seen[1]

    async def main() -> list[object]:
        async def one() -> object:
            return current_caller()

        first = await asyncio.create_task(one())
        second = await asyncio.create_task(one())
        return [first, second, current_caller()]

    tasks = asyncio.run(main())
    assert len({id(task) for task in tasks}) == 3
    assert all(isinstance(task, asyncio.Task) for task in tasks)
