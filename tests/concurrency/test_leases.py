"""The lease table and the memory store's concurrency limits, on a fake clock."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ratewarden
from ratewarden import (
    AsyncConcurrencyLimiter,
    AsyncMemoryStore,
    ConcurrencyLimiter,
    ConfigurationError,
    FakeClock,
    LeaseNotHeld,
    MemoryStore,
    RateLimitTimeout,
)
from ratewarden._concurrency_core import LOST
from ratewarden.stores.leases import BUSY, DUPLICATE, EXPIRED, OK, UNKNOWN, LeaseTable, Outcome

T0 = 1_763_700_000_000_000


def test_take_until_full_then_busy_with_the_wait_until_the_first_lease_ends() -> None:
    table = LeaseTable()
    assert table.call("take", "k", "a", 2, 1000, now=T0) == Outcome(OK, 1, 0, 0)
    assert table.call("take", "k", "b", 2, 1000, now=T0 + 10) == Outcome(OK, 2, 0, 0)
    assert table.call("take", "k", "c", 2, 1000, now=T0 + 20) == Outcome(BUSY, 2, 0, 980)
    assert table.call("count", "k", "", 2, 0, now=T0 + 20) == Outcome(OK, 2, 0, 0)


def test_an_ended_lease_is_reclaimed_by_the_next_take_at_its_expiry_exactly() -> None:
    table = LeaseTable()
    table.call("take", "k", "a", 1, 1000, now=T0)
    assert table.call("take", "k", "b", 1, 1000, now=T0 + 999).status == BUSY
    assert table.call("take", "k", "b", 1, 1000, now=T0 + 1000) == Outcome(OK, 1, 1, 0)


def test_release_twice_frees_one_slot_once() -> None:
    table = LeaseTable()
    for lease in "ab":
        table.call("take", "k", lease, 2, 1000, now=T0)
    assert table.call("release", "k", "a", 2, 1000, now=T0) == Outcome(OK, 1, 0, 0)
    assert table.call("release", "k", "a", 2, 1000, now=T0) == Outcome(UNKNOWN, 1, 0, 0)
    assert table.call("count", "k", "", 2, 0, now=T0).held == 1  # b still holds its slot


def test_release_or_renew_of_an_ended_lease_says_expired_and_reclaims_it() -> None:
    table = LeaseTable()
    table.call("take", "k", "a", 1, 1000, now=T0)
    table.call("take", "k", "b", 2, 5000, now=T0)
    assert table.call("renew", "k", "a", 1, 1000, now=T0 + 1000) == Outcome(EXPIRED, 1, 1, 0)
    assert table.call("release", "k", "a", 1, 1000, now=T0 + 1000) == Outcome(UNKNOWN, 1, 0, 0)


def test_renew_pushes_the_expiry_on() -> None:
    table = LeaseTable()
    table.call("take", "k", "a", 1, 1000, now=T0)
    assert table.call("renew", "k", "a", 1, 1000, now=T0 + 900).status == OK
    assert table.call("take", "k", "b", 1, 1000, now=T0 + 1800) == Outcome(BUSY, 1, 0, 100)


def test_a_duplicate_id_is_refused() -> None:
    table = LeaseTable()
    table.call("take", "k", "a", 2, 1000, now=T0)
    assert table.call("take", "k", "a", 2, 1000, now=T0).status == DUPLICATE


def test_memory_stays_bounded_by_the_leases_held() -> None:
    """Dead holders' leases on keys nobody takes again are swept."""
    table = LeaseTable()
    for i in range(5000):
        table.call("take", f"k{i}", "a", 1, 1000, now=T0 + i * 10)
    assert len(table.keys) < 2200, len(table.keys)
    table.call("release", "k4999", "a", 1, 1000, now=T0 + 50_000)
    assert table.sweep(T0 + 10**9) == len(table.keys) or not table.keys
    assert not table.keys


@pytest.fixture
def fake() -> FakeClock:
    return FakeClock()


def test_a_lease_that_ends_gives_its_slot_back_on_a_fake_clock(fake: FakeClock) -> None:
    limiter = ConcurrencyLimiter(1, store=MemoryStore(clock=fake), lease=30.0)
    hold = limiter.hold("k")
    hold.__enter__()  # a holder that never leaves: it died
    with pytest.raises(RateLimitTimeout) as caught:
        limiter.hold("k").__enter__()
    assert caught.value.retry_after == pytest.approx(30.0)
    fake.advance(29.999)
    assert limiter.in_flight("k") == 1
    fake.advance(0.001)
    assert limiter.in_flight("k") == 0
    with limiter.hold("k") as other:
        assert other.lease_id != hold.lease_id
        assert limiter.stats.reclaimed == 1
    with pytest.raises(LeaseNotHeld, match="released already, or its lease ended"):
        hold.__exit__(None, None, None)
    assert limiter.stats.lost == 1


def test_release_of_an_expired_lease_says_so(fake: FakeClock) -> None:
    limiter = ConcurrencyLimiter(2, store=MemoryStore(clock=fake), lease=60.0)
    hold = limiter.hold("k").__enter__()
    fake.advance(60.0)
    with pytest.raises(LeaseNotHeld, match=r"lease \(60.0s\) had ended before this release"):
        hold.release()


def test_release_of_a_hold_whose_renewal_found_its_lease_ended_says_so_once(
    fake: FakeClock,
) -> None:
    """A process stopped past its lease (SIGSTOP, a long pause): its renewer, back,
    finds the lease gone and marks the hold lost; the one release is not a second."""
    limiter = ConcurrencyLimiter(2, store=MemoryStore(clock=fake), lease=60.0)
    with limiter.hold("k") as hold:
        hold.state = LOST  # what the renewer does when a renewal finds the lease ended
        with pytest.raises(LeaseNotHeld, match=r"lease \(60.0s\) had ended before this release"):
            hold.release()
    # the block's end says nothing more: it was said
    assert repr(limiter.stats) == (
        "ConcurrencyStats(taken=1, timeouts=0, reclaimed=0, lost=0, waiting=0)"
    )


def test_releasing_twice_does_not_free_a_second_slot(fake: FakeClock) -> None:
    limiter = ConcurrencyLimiter(2, store=MemoryStore(clock=fake))
    with limiter.hold("k") as first, limiter.hold("k"):
        first.release()
        assert limiter.in_flight("k") == 1
        with pytest.raises(LeaseNotHeld, match="is released: a hold releases its slot once"):
            first.release()
        with pytest.raises(LeaseNotHeld, match="released already"):
            limiter.release("k", first.lease_id)  # by id: the store finds nothing
        assert limiter.in_flight("k") == 1
    assert limiter.in_flight("k") == 0


def test_release_by_an_unknown_id(fake: FakeClock) -> None:
    limiter = ConcurrencyLimiter(2, store=MemoryStore(clock=fake))
    with pytest.raises(LeaseNotHeld, match="'nope' of 'limit=2' key 'k'"):
        limiter.release("k", "nope")


def test_the_slot_comes_back_when_the_block_raises(fake: FakeClock) -> None:
    limiter = ConcurrencyLimiter(1, store=MemoryStore(clock=fake))
    with pytest.raises(KeyError), limiter.hold("k"):
        raise KeyError("x")
    assert limiter.in_flight("k") == 0


def test_a_hold_enters_once(fake: FakeClock) -> None:
    limiter = ConcurrencyLimiter(3, store=MemoryStore(clock=fake))
    hold = limiter.hold("k")
    with hold, pytest.raises(ConfigurationError, match="entered already"):
        hold.__enter__()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"limit": 0}, "integer >= 1, got 0"),
        ({"limit": 1.5}, "integer >= 1, got 1.5"),
        ({"limit": True}, "integer >= 1, got True"),
        ({"limit": 1, "lease": 0}, "0.001 to 86400 seconds, got 0"),
        ({"limit": 1, "lease": -1.0}, "got -1.0"),
        ({"limit": 1, "lease": float("nan")}, "got nan"),
        ({"limit": 1, "lease": "30"}, "number of seconds, got '30'"),
        ({"limit": 1, "name": ""}, "non-empty string"),
    ],
)
def test_bad_options_are_refused(args: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ConcurrencyLimiter(**args)
    with pytest.raises(ConfigurationError, match=message):
        AsyncConcurrencyLimiter(**args)


def test_a_negative_max_wait_is_refused() -> None:
    limiter = ConcurrencyLimiter(1)
    with pytest.raises(ConfigurationError, match="max_wait must be >= 0"):
        limiter.hold("k", max_wait=-1)
    with pytest.raises(ConfigurationError, match="max_wait must be >= 0"):
        AsyncConcurrencyLimiter(1).hold("k", max_wait=-0.5)


def test_the_names_are_public() -> None:
    for name in ("ConcurrencyLimiter", "AsyncConcurrencyLimiter", "LeaseNotHeld"):
        assert name in ratewarden.__all__
    assert issubclass(ratewarden.LeaseNotHeld, LookupError)


@given(
    limit=st.integers(1, 3),
    steps=st.lists(
        st.tuples(st.sampled_from(["take", "release", "advance"]), st.integers(0, 7)),
        max_size=50,
    ),
)
def test_the_limiter_matches_a_naive_model(limit: int, steps: list[tuple[str, int]]) -> None:
    """Holds against a list of expiries: a take passes exactly when fewer than
    ``limit`` leases have not ended; a release of an ended lease raises."""
    fake = FakeClock()
    # a lease far longer than the test runs: no renewal (on the real clock) comes
    limiter = ConcurrencyLimiter(limit, store=MemoryStore(clock=fake), lease=60.0)
    held: list[tuple[ratewarden.Hold, int]] = []  # the model: holds and their expiries (us)
    for op, n in steps:
        now = fake.time_ns() // 1000
        live = [(h, end) for h, end in held if end > now]
        if op == "take":
            hold = limiter.hold("k")
            if len(live) < limit:
                hold.__enter__()
                held.append((hold, now + 60_000_000))
            else:
                with pytest.raises(RateLimitTimeout):
                    hold.__enter__()
        elif op == "release" and held:
            hold, end = held.pop(n % len(held))
            if end > now:
                hold.release()
            else:
                with pytest.raises(LeaseNotHeld):
                    hold.release()
        elif op == "advance":
            fake.advance(n * 15.0)
        now = fake.time_ns() // 1000
        assert limiter.in_flight("k") == len([1 for _, end in held if end > now])


async def _async_memory(fake: FakeClock) -> None:
    limiter = AsyncConcurrencyLimiter(1, store=AsyncMemoryStore(clock=fake), lease=60.0)
    async with limiter.hold("k") as hold:
        assert await limiter.in_flight("k") == 1
        with pytest.raises(RateLimitTimeout):
            async with limiter.hold("k"):
                pass
        fake.advance(60.0)
        async with limiter.hold("k"):
            assert limiter.stats.reclaimed == 1
    assert hold.state == "released"


def test_async_memory_on_a_fake_clock(fake: FakeClock) -> None:
    with pytest.raises(LeaseNotHeld):  # the outer hold's lease ended inside
        asyncio.run(_async_memory(fake))


def test_clearing_the_store_frees_every_slot(fake: FakeClock) -> None:
    store = MemoryStore(clock=fake)
    limiter = ConcurrencyLimiter(1, store=store, lease=60.0)
    limiter.hold("k").__enter__()
    store.clear()
    assert limiter.in_flight("k") == 0


def test_a_store_without_lease_tables_is_refused() -> None:
    from tests.stores.test_custom_store import DictStore  # noqa: PLC0415

    with pytest.raises(ConfigurationError, match="DictStore keeps no lease tables"):
        ConcurrencyLimiter(1, store=DictStore(FakeClock()))  # type: ignore[arg-type]


def _wait_for_no_renewer(limiter: ratewarden.ConcurrencyLimiter, why: str) -> None:
    """Until the limiter's renewer has dropped its handle (5 s at most: else ``why``)."""
    deadline = time.monotonic() + 5

    def renewer() -> threading.Thread | None:  # read anew each time (mypy narrows a field)
        return limiter._renewer

    while renewer() is not None:
        assert time.monotonic() < deadline, why
        time.sleep(0.01)


def _held_through_three_leases(limiter: ratewarden.ConcurrencyLimiter) -> None:
    """A hold of a limiter of a 0.3 s lease, 1 s long: held all along, so renewed."""
    with limiter.hold("k") as hold:
        time.sleep(1.0)
        assert hold.held
        assert limiter.in_flight("k") == 1


def test_holds_one_after_another_share_one_renewer_thread_which_ends_when_idle() -> None:
    """The renewer outlives a release by `LINGER` (here a third of the lease):
    holds one after another each started a thread of their own before."""
    limiter = ratewarden.ConcurrencyLimiter(2, lease=0.3, name="renewer-reuse")
    started = threading.active_count()
    renewers = set()
    for _ in range(200):
        with limiter.hold("k"):
            renewers.add(limiter._renewer)
    assert len(renewers) == 1
    assert threading.active_count() <= started + 1
    # nothing held for 0.1 s: it ends
    _wait_for_no_renewer(limiter, "the renewer did not end with nothing held")
    with limiter.hold("k"):  # and the next hold starts another
        assert limiter._renewer is not None
    limiter.close()


def test_a_renewer_an_error_ended_gives_way_to_another(monkeypatch: pytest.MonkeyPatch) -> None:
    """A take starts a renewer when the limiter has none; one that an unforeseen
    error ends must drop its handle, or no hold after it would be renewed."""
    limiter = ratewarden.ConcurrencyLimiter(1, lease=0.3, name="renewer-error")
    broken = threading.Event()

    def fails() -> Any:
        broken.set()
        raise RuntimeError("unforeseen")

    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # its traceback, unprinted
    monkeypatch.setattr(limiter, "_renewal_due", fails)
    with limiter.hold("k"):
        assert broken.wait(5)
    _wait_for_no_renewer(limiter, "the failed renewer kept its handle")
    monkeypatch.undo()
    _held_through_three_leases(limiter)  # renewed by the new renewer
    limiter.close()


def test_a_renewer_that_failed_to_start_is_started_by_the_next_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread that cannot start (the process out of threads) must leave no
    handle behind, or no later hold of the limiter would be renewed."""
    limiter = ratewarden.ConcurrencyLimiter(1, lease=0.3, name="renewer-start")

    def cannot_start(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", cannot_start)
    with pytest.raises(RuntimeError, match="can't start new thread"), limiter.hold("k"):
        pass
    monkeypatch.undo()
    time.sleep(0.35)  # the first hold's lease, never released, ends
    _held_through_three_leases(limiter)  # renewed by a renewer that did start
    limiter.close()


def test_a_hold_taken_while_the_renewer_lingers_is_renewed() -> None:
    limiter = ratewarden.ConcurrencyLimiter(1, lease=0.3, name="renewer-linger")
    with limiter.hold("k"):
        pass
    time.sleep(0.05)  # the renewer lingers, nothing held
    _held_through_three_leases(limiter)
    assert limiter.in_flight("k") == 0
    limiter.close()


def test_an_async_hold_in_a_new_loop_is_renewed_though_an_old_loop_left_its_renewer() -> None:
    """A loop closed without ending its tasks keeps its lingering renewer pending
    for ever: the next loop's holds get a renewer of their own."""
    limiter = ratewarden.AsyncConcurrencyLimiter(1, lease=0.3, name="renewer-loops")

    async def quick() -> None:
        async with limiter.hold("k"):
            pass

    old = asyncio.new_event_loop()
    old.run_until_complete(quick())
    old.close()  # its renewer lingers, pending, never to run again

    async def long() -> tuple[bool, int]:
        async with limiter.hold("k") as hold:
            await asyncio.sleep(1.0)  # three leases
            return hold.held, await limiter.in_flight("k")

    assert asyncio.run(long()) == (True, 1)


def _hold_long_in_a_child(limiter: ratewarden.ConcurrencyLimiter, out: Any) -> None:
    with limiter.hold("k") as hold:
        time.sleep(0.5)  # three leases
        out.put((hold.held, limiter.in_flight("k")))


def _long_hold_in_a_child(
    limiter: ratewarden.ConcurrencyLimiter, forked: Callable[[], None] = lambda: None
) -> tuple[bool, int]:
    """Fork, call ``forked``, and say what the child's long hold saw: held, and
    the store's count of holds meanwhile. A child stuck is killed, never left."""
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_hold_long_in_a_child, args=(limiter, out))
    child.start()
    try:
        forked()
        seen: tuple[bool, int] = out.get(timeout=10)
    finally:
        child.join(10)
        if child.exitcode is None:
            child.kill()
            child.join()
    assert child.exitcode == 0
    return seen


def test_a_hold_in_a_forked_child_is_renewed_though_the_parent_had_a_renewer() -> None:
    """Forked while the parent's renewer lingers, the child has the thread's
    handle but not the thread: its holds get a renewer of their own."""
    limiter = ratewarden.ConcurrencyLimiter(1, lease=0.15, name="renewer-fork")
    for _ in range(3):
        with limiter.hold("k"):
            pass
        assert _long_hold_in_a_child(limiter) == (True, 1)
    limiter.close()


def _fork_holding(limiter: ratewarden.ConcurrencyLimiter, lock: Any) -> tuple[bool, int]:
    """Fork while another thread holds ``lock``, and what the child's long hold saw."""
    held, done = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            held.set()
            done.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(5)
    try:
        return _long_hold_in_a_child(limiter, done.set)
    finally:
        done.set()
        thread.join()


def test_a_child_forked_while_a_thread_held_the_limiters_locks_can_hold() -> None:
    """A lock another thread held at the fork stays held in the child for ever, but
    for the limiter's reset at fork (the renewer holds one every time it looks)."""
    limiter = ratewarden.ConcurrencyLimiter(1, lease=0.15, name="fork-lock")
    assert _fork_holding(limiter, limiter._lock) == (True, 1)
    assert _fork_holding(limiter, limiter._stats_lock) == (True, 1)
    limiter.close()
