"""The coordinator's Lua script against its Python model, on a real Redis.

Hypothesis draws sequences of operations (create or change the resource, member
refreshes with random wants, leaves, time passing past leases, Redis losing the
resource); both sides run each with the same explicit clock, and every reply, the
state left behind and the messages published must be identical.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from ratewarden.fleet import Coordinator, QuotaConfig, Report
from ratewarden.fleet.alloc import ALLOCATORS, MAX_PIECES
from ratewarden.fleet.coordinator import keys
from ratewarden.fleet.model import Model
from tests.redis_server import RedisServer

START_MS = 1_763_900_000_000


class Clock:
    def __init__(self) -> None:
        self.ms = START_MS

    def time_ns(self) -> int:
        return self.ms * 1_000_000

    def sleep(self, seconds: float) -> None:
        raise AssertionError("never sleeps")

    async def asleep(self, seconds: float) -> None:
        raise AssertionError("never sleeps")


def _text(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [_text(v) for v in value]
    return value


def _normal(reply: Any) -> Any:
    """Replies with their configuration lists as dicts (hash order differs)."""
    reply = _text(reply)
    if isinstance(reply, list) and len(reply) >= 3 and isinstance(reply[2], list):  # show
        return [
            *reply[:2],
            dict(zip(reply[2][::2], reply[2][1::2], strict=True)),
            sorted(reply[3:]),
        ]
    if isinstance(reply, list) and len(reply) >= 7 and isinstance(reply[6], list):  # refresh
        return [*reply[:6], dict(zip(reply[6][::2], reply[6][1::2], strict=True))]
    return reply


configs = st.builds(
    QuotaConfig,
    rate=st.sampled_from(["10/second", "7/second", "2000/second", "1000000/second", "90/minute"]),
    algorithm=st.sampled_from(ALLOCATORS),
    refresh=st.just(1.0),
    lease=st.sampled_from([2.0, 5.0]),
    cap=st.integers(1, 500),
    adaptive=st.booleans(),
    floor=st.integers(0, 5),
)
members = st.sampled_from(["a", "b", "c", "d", "e", "f"])
ops = st.one_of(
    st.tuples(st.just("set"), configs),
    st.tuples(
        st.just("refresh"),
        members,
        st.integers(0, 3_000_000),  # wants
        st.integers(0, 3_000_000),  # reported has
        st.integers(0, 3_000_000),  # used
        st.integers(0, 2),  # throttled
        # a configuration to create the resource from, if it is missing: none,
        # the one last stored (a rebuild), or one given and never stored
        st.one_of(st.none(), st.just("known"), configs),
        st.one_of(  # where it says its grant lies: as it was told, or anything
            st.none(),
            st.lists(
                st.tuples(st.integers(-5, 3_000_000), st.integers(0, 1_000_000)),
                max_size=MAX_PIECES + 1,
            ),
        ),
        st.booleans(),  # paced
    ),
    st.tuples(st.just("leave"), members),
    st.tuples(st.just("wait"), st.integers(0, 6_000)),  # ms
    st.tuples(st.just("flush")),
    st.tuples(st.just("show")),
)


@pytest.fixture(scope="module")
def client(redis_single: RedisServer) -> Iterator[redis.Redis]:
    with redis_single.client() as c:
        yield c


@settings(max_examples=120)
@given(st.lists(ops, min_size=1, max_size=40))
def test_lua_and_model_agree(client: redis.Redis, sequence: list[tuple[Any, ...]]) -> None:
    name = f"parity-{uuid.uuid4().hex[:12]}"
    clock = Clock()
    lua = Coordinator(client, name, clock=clock)
    model = Model()
    pubsub = client.pubsub()  # type: ignore[no-untyped-call]
    pubsub.subscribe(lua.channel)
    assert pubsub.get_message(timeout=1.0) is not None  # the subscription's confirmation
    published: list[str] = []
    restore: dict[str, str] | None = None
    told: dict[str, list[tuple[int, int]]] = {}  # each member's pieces, last replied
    try:
        for op in sequence:
            kind = op[0]
            if kind == "set":
                fields = op[1].fields()
                got = lua._call("set", [p for pair in fields.items() for p in pair])
                want = model.set(clock.ms, fields)
            elif kind == "refresh":
                got, want = _refresh(lua, model, clock, op, restore=restore, told=told)
            elif kind == "leave":
                got, want = lua._call("leave", [op[1]]), model.leave(clock.ms, op[1])
            elif kind == "wait":
                clock.ms += op[1]
                continue
            elif kind == "flush":  # Redis restarted empty
                client.delete(*keys(name))
                model.cfg.clear()
                model.members.clear()
                continue
            else:
                got, want = lua._call("show", []), model.show(clock.ms)
            assert _normal(got) == _normal(want), op
            if model.cfg:
                restore = {k: v for k, v in model.cfg.items() if k not in ("seq", "rebuild_ms")}
            cfg_key, members_key = keys(name)
            assert _text_dict(client.hgetall(cfg_key)) == model.cfg
            assert {_text(k): v for k, v in client.hgetall(members_key).items()} == model.members
            while (message := pubsub.get_message(timeout=0.01)) is not None:
                published.append(_text(message["data"]))
            assert published == model.published
    finally:
        pubsub.close()
        client.delete(*keys(name))


def _refresh(
    lua: Coordinator,
    model: Model,
    clock: Clock,
    op: tuple[Any, ...],
    *,
    restore: dict[str, str] | None,
    told: dict[str, list[tuple[int, int]]],
) -> tuple[Any, Any]:
    """One refresh on both sides; ``told`` keeps each member's pieces."""
    _, member, wants, has, used, throttled, create, claim, paced = op
    pieces = told.get(member, []) if claim is None else claim
    if isinstance(create, QuotaConfig):
        extra: dict[str, str] | None = create.fields()
    else:
        extra = restore if create == "known" and restore else None
    args = [member, wants, has, used, throttled, spans(pieces), "paced" if paced else ""]
    if extra:
        args += [p for pair in extra.items() for p in pair]
    got = lua._call("refresh", args)
    report = Report(wants, has, used, throttled, tuple(pieces), extra, paced)
    want = model.refresh(clock.ms, member, report)
    if want[0]:
        told[member] = list(zip(want[3][::2], want[3][1::2], strict=True))
    return got, want


def _text_dict(raw: dict[Any, Any]) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in raw.items()}


@settings(max_examples=60)
@given(
    st.sampled_from(ALLOCATORS),
    st.sampled_from(["10/second", "7/second", "2000/second", "90/minute"]),
    st.lists(
        st.tuples(members, st.integers(-1, 3_000_000), st.integers(0, 400)),
        min_size=4,
        max_size=150,
    ),
)
def test_busy_resource_agrees(
    client: redis.Redis, algorithm: str, rate: str, refreshes: list[tuple[str, int, int]]
) -> None:
    """Many members refreshing often, some leaving (wants -1), under overload:
    every allocation path runs, and the free space of the line breaks into gaps."""
    name = f"parity-{uuid.uuid4().hex[:12]}"
    clock = Clock()
    lua = Coordinator(client, name, clock=clock)
    model = Model()
    fields = QuotaConfig(rate, algorithm=algorithm, cap=3).fields()
    try:
        assert _normal(lua._call("set", [p for pair in fields.items() for p in pair])) == (
            _normal(model.set(clock.ms, fields))
        )
        for member, wants, gap in refreshes:
            clock.ms += gap
            if wants < 0:
                assert lua._call("leave", [member]) == model.leave(clock.ms, member)
                continue
            got = lua._call("refresh", [member, wants, 0, 0, 0, ""])
            want = model.refresh(clock.ms, member, Report(wants, 0, 0))
            assert _normal(got) == _normal(want)
    finally:
        client.delete(*keys(name))


@settings(max_examples=60)
@given(
    st.sampled_from(ALLOCATORS),
    st.lists(st.tuples(members, st.integers(0, 3_000_000)), min_size=2, max_size=30),
    st.lists(st.tuples(members, st.booleans()), min_size=1, max_size=12),
)
def test_rebuild_agrees(
    client: redis.Redis,
    algorithm: str,
    before: list[tuple[str, int]],
    after: list[tuple[str, bool]],
) -> None:
    """Redis loses the resource; the members come back saying what they hold and
    where (as they were told, or shifted onto another's), with the configuration."""
    name = f"parity-{uuid.uuid4().hex[:12]}"
    clock = Clock()
    lua = Coordinator(client, name, clock=clock)
    model = Model()
    fields = QuotaConfig("2000/second", algorithm=algorithm, cap=300).fields()
    told: dict[str, tuple[int, list[tuple[int, int]]]] = {}
    try:
        lua._call("set", [p for pair in fields.items() for p in pair])
        model.set(clock.ms, fields)
        for member, wants in before:
            clock.ms += 100
            lua._call("refresh", [member, wants, 0, 0, 0, ""])
            want = model.refresh(clock.ms, member, Report(wants, 0, 0))
            told[member] = (want[1], list(zip(want[3][::2], want[3][1::2], strict=True)))
        restore = {k: v for k, v in model.cfg.items() if k not in ("seq", "rebuild_ms")}
        client.delete(*keys(name))
        model.cfg.clear()
        model.members.clear()
        for member, shifted in after:
            clock.ms += 100
            has, pieces = told.get(member, (0, []))
            if shifted:
                pieces = [(start + 500, length) for start, length in pieces]
            args = [member, 3_000_000, has, 0, 0, spans(pieces), ""]
            args += [p for pair in restore.items() for p in pair]
            got = lua._call("refresh", args)
            report = Report(3_000_000, has, 0, pieces=tuple(pieces), restore=restore)
            want = model.refresh(clock.ms, member, report)
            assert _normal(got) == _normal(want)
            members_key = keys(name)[1]
            assert {_text(k): v for k, v in client.hgetall(members_key).items()} == model.members
    finally:
        client.delete(*keys(name))


def spans(pieces: list[tuple[int, int]]) -> str:
    """Pieces as a refresh sends them."""
    return " ".join(f"{start} {length}" for start, length in pieces)


def test_a_grant_gathers_the_free_gaps(client: redis.Redis) -> None:
    """Members leave holes in the line; a member that grows takes the hole next
    to it, then the largest others, one piece each, up to MAX_PIECES: on both
    sides, with the pieces spelled out."""
    name = f"parity-{uuid.uuid4().hex[:12]}"
    clock = Clock()
    lua = Coordinator(client, name, clock=clock)
    model = Model()
    n = 2 * MAX_PIECES + 2  # members of a permit each, end to end
    fields = QuotaConfig(f"{n}/second", algorithm="static", cap=n).fields()

    def both(op: str, args: list[Any], report: Report | None = None) -> Any:
        got = lua._call(op, args)
        if report is not None:
            want = model.refresh(clock.ms, args[0], report)
        else:
            want = model.leave(clock.ms, args[0])
        assert _normal(got) == _normal(want)
        return want

    try:
        lua._call("set", [p for pair in fields.items() for p in pair])
        model.set(clock.ms, fields)
        for i in range(n):
            both("refresh", [f"m{i:02d}", 1000, 0, 0, 0, ""], Report(1000, 0, 0))
        for i in range(1, n, 2):  # a hole after every other member: MAX_PIECES + 1 holes
            both("leave", [f"m{i:02d}"])
        wants = (MAX_PIECES + 2) * 1000
        reply = both("refresh", ["m00", wants, 1000, 0, 0, ""], Report(wants, 1000, 0))
        pieces = list(zip(reply[3][::2], reply[3][1::2], strict=True))
        # the hole next to it, then holes of a permit each until it has MAX_PIECES
        assert pieces == [(0, 2000)] + [(2000 * k + 1000, 1000) for k in range(1, MAX_PIECES)]
        assert reply[1] == wants - 1000  # a hole short: the last one stays free
    finally:
        client.delete(*keys(name))


@pytest.mark.parametrize("holds", [0, 5_000])
def test_a_config_never_stored_creates_the_resource_as_set_does(
    client: redis.Redis, holds: int
) -> None:
    """A member that started before its Redis sends the configuration it was
    given (no version): the first refresh creates the resource as `set` would, and
    only a member that spends a safe share meanwhile starts a rebuild."""
    name = f"parity-{uuid.uuid4().hex[:12]}"
    clock = Clock()
    lua = Coordinator(client, name, clock=clock)
    model = Model()
    given_config = QuotaConfig("50/second", "fair_share", safe=5)
    op = ("refresh", "late", 50_000, holds, 0, 0, given_config, None, False)
    try:
        got, want = _refresh(lua, model, clock, op, restore=None, told={})
        assert _normal(got) == _normal(want)
        assert _text_dict(client.hgetall(keys(name)[0])) == model.cfg
        assert model.cfg["version"] == "1"
        assert model.cfg["eff_m"] == "50000"
        if holds:  # it spends space the coordinator never knew of
            assert int(model.cfg["rebuild_ms"]) > clock.ms
            assert want[1] == holds
        else:
            assert "rebuild_ms" not in model.cfg
            assert want[1] == 50_000  # the whole total, at once
    finally:
        client.delete(*keys(name))
