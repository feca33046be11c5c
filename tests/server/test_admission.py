"""Which connection a listener closes to admit a new one at its caps: the one
idle longest, else the one whose request has been arriving longest past the
grace, never one whose answer is in the making; per address at the address's
cap, among all at ``max_connections``."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from ratewarden.server._connection_limits import Admission

GRACE = 1.0


@dataclass(eq=False)
class Conn:
    name: str
    evicted: list[str] = field(default_factory=list)

    def evict(self) -> None:
        self.evicted.append(self.name)


def opened(admission: Admission, peer: str, names: list[str], now: float = 0.0) -> list[Conn]:
    conns = [Conn(name) for name in names]
    for conn in conns:
        assert admission.admit(conn, peer, now)
    return conns


def test_at_the_address_cap_its_oldest_idle_goes_first_then_its_oldest_arriving_request() -> None:
    admission = Admission(100, 3, GRACE)
    a, b, c = opened(admission, "10.0.0.1", ["a", "b", "c"])
    other = opened(admission, "10.0.0.2", ["other"])[0]  # idle longer, but another address's
    admission.reading(a, since=0.0)
    admission.reading(b, since=0.5)
    admission.busy(c)  # its answer is in the making
    admission.idle(other)
    # the address's own request arriving longest makes room, within the grace too:
    # reopening slow connections faster than the grace cannot shut the address out
    d = Conn("d")
    assert admission.admit(d, "10.0.0.1", now=0.6)
    assert a.evicted == ["a"]
    assert [b.evicted, c.evicted, other.evicted] == [[], [], []]
    # a new connection is idle until its request begins: it goes before b's stalled one
    e = Conn("e")
    assert admission.admit(e, "10.0.0.1", now=1.3)
    assert d.evicted == ["d"]
    assert not b.evicted
    admission.busy(e)
    assert admission.admit(Conn("f"), "10.0.0.1", now=0.8)  # b, the address's oldest arriving
    assert b.evicted == ["b"]
    admission.idle(c)  # answered: idle, while f (new) became idle before it
    g = Conn("g")
    assert admission.admit(g, "10.0.0.1", now=0.9)
    assert not c.evicted  # f went: idle longer


def test_at_max_connections_the_oldest_of_all_goes_idle_first() -> None:
    admission = Admission(3, 100, GRACE)
    x = opened(admission, "10.0.0.1", ["x"], now=0.0)[0]
    y = opened(admission, "10.0.0.2", ["y"], now=0.0)[0]
    z = opened(admission, "10.0.0.3", ["z"], now=0.0)[0]
    admission.reading(x, since=0.0)
    admission.reading(y, since=0.2)
    admission.idle(z)
    n1 = Conn("n1")
    assert admission.admit(n1, "10.0.0.9", now=0.1)
    assert z.evicted == ["z"]  # idle, though the youngest
    admission.busy(n1)
    assert not admission.admit(Conn("n2"), "10.0.0.9", now=0.5)  # both within the grace
    assert admission.admit(Conn("n3"), "10.0.0.9", now=1.1)
    assert x.evicted == ["x"]
    assert not y.evicted


def test_at_max_connections_another_address_s_request_keeps_its_grace() -> None:
    admission = Admission(2, 100, GRACE)
    a, b = opened(admission, "10.0.0.1", ["a", "b"])
    admission.reading(a, since=0.0)
    admission.reading(b, since=0.0)
    assert not admission.admit(Conn("early"), "10.0.0.2", now=0.5)
    assert admission.admit(Conn("late"), "10.0.0.2", now=1.0)
    assert a.evicted == ["a"]


def test_a_request_being_answered_is_never_closed_for_another() -> None:
    admission = Admission(2, 2, GRACE)
    conns = opened(admission, "10.0.0.1", ["a", "b"])
    for conn in conns:
        admission.reading(conn, since=0.0)
        admission.busy(conn)
    assert not admission.admit(Conn("late"), "10.0.0.1", now=1_000.0)
    assert not any(conn.evicted for conn in conns)


State = dict[Conn, tuple[str, str, float]]  # conn: (peer, "idle"/"reading"/"busy", since)


def model_victim(
    pool: list[Conn], state: State, order: list[Conn], now: float, grace: float
) -> Conn | None:
    """The naive choice: scan for the idle one that became idle first, else the
    request arriving since longest, if past ``grace``."""
    idle = [c for c in order if c in pool and state[c][1] == "idle"]
    if idle:
        return idle[0]
    reading = sorted((state[c][2], order.index(c), c) for c in pool if state[c][1] == "reading")
    if reading and now - reading[0][0] >= grace:
        return reading[0][2]
    return None


def model_admit(state: State, order: list[Conn], peer: str, now: float) -> list[Conn] | None:
    """What the naive model closes to admit a connection of ``peer``; None: refused."""
    closed: list[Conn] = []
    if len([c for c in state if state[c][0] == peer]) >= 5:
        mine = [c for c in state if state[c][0] == peer]
        victim = model_victim(mine, state, order, now, grace=0.0)  # its own: any age
        if victim is None:
            return None
        closed.append(victim)
    if len(state) - len(closed) >= 12:
        victim = model_victim([c for c in state if c not in closed], state, order, now, GRACE)
        if victim is None:
            return None
        closed.append(victim)
    return closed


@pytest.mark.parametrize("seed", range(20))
def test_the_books_match_a_naive_model_whatever_the_order(seed: int) -> None:
    """Random opens, state changes and closes against a list-scanning model."""
    rng = random.Random(seed)
    admission = Admission(12, 5, GRACE)
    state: State = {}
    order: list[Conn] = []  # when each entered its state, oldest first
    now = 0.0
    for step in range(400):
        now += rng.random() * 0.3
        action = rng.random()
        if action < 0.4 or not state:
            peer = f"10.0.0.{rng.randint(1, 4)}"
            conn = Conn(f"{step}")
            closed = model_admit(state, order, peer, now)
            assert admission.admit(conn, peer, now) is (closed is not None), step
            for victim in closed or ():
                assert victim.evicted == [victim.name]
                del state[victim]
                order.remove(victim)
            if closed is not None:
                state[conn] = (peer, "idle", now)
                order.append(conn)
            assert admission.count == len(state)
            continue
        conn = rng.choice(list(state))
        peer, _, since = state[conn]
        order.remove(conn)
        if action < 0.6:
            admission.reading(conn, since=now)
            state[conn] = (peer, "reading", now)
        elif action < 0.75:
            admission.busy(conn)
            state[conn] = (peer, "busy", since)
        elif action < 0.9:
            admission.idle(conn)
            state[conn] = (peer, "idle", now)
        else:
            admission.left(conn)
            del state[conn]
            assert admission.count == len(state)
            continue
        order.append(conn)
        assert admission.count == len(state)
