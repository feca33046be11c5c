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
from hypothesis import given, settings
from hypothesis import strategies as st

import redis
from ratewarden.fleet import Coordinator, QuotaConfig
from ratewarden.fleet._alloc import ALLOCATORS
from ratewarden.fleet._coord import keys
from ratewarden.fleet._model import Model
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
    if isinstance(reply, list) and len(reply) >= 7 and isinstance(reply[6], list):
        reply = [*reply[:6], dict(zip(reply[6][::2], reply[6][1::2], strict=True))]
    if isinstance(reply, list) and len(reply) >= 3 and isinstance(reply[2], list):
        reply = [
            *reply[:2],
            dict(zip(reply[2][::2], reply[2][1::2], strict=True)),
            sorted(reply[3:]),
        ]
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
        st.booleans(),  # send a configuration to restore
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
    try:
        for op in sequence:
            kind = op[0]
            if kind == "set":
                fields = op[1].fields()
                got = lua._call("set", [p for pair in fields.items() for p in pair])
                want = model.set(clock.ms, fields)
            elif kind == "refresh":
                _, member, wants, has, used, throttled, with_restore = op
                if not model.cfg and not restore:
                    with_restore = False
                args = [member, wants, has, used, throttled]
                extra = restore if with_restore and restore else None
                if extra:
                    args += [p for pair in extra.items() for p in pair]
                got = lua._call("refresh", args)
                want = model.refresh(
                    clock.ms,
                    member,
                    wants=wants,
                    reported=has,
                    used=used,
                    throttled=throttled,
                    restore=extra,
                )
            elif kind == "leave":
                got, want = lua._call("leave", [op[1]]), model.leave(op[1])
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


def _text_dict(raw: dict[Any, Any]) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in raw.items()}


@settings(max_examples=60)
@given(
    st.sampled_from(ALLOCATORS),
    st.sampled_from(["10/second", "7/second", "2000/second", "90/minute"]),
    st.lists(
        st.tuples(members, st.integers(0, 3_000_000), st.integers(0, 400)),
        min_size=4,
        max_size=40,
    ),
)
def test_busy_resource_agrees(
    client: redis.Redis, algorithm: str, rate: str, refreshes: list[tuple[str, int, int]]
) -> None:
    """Many members refreshing often under overload: every allocation path runs."""
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
            got = lua._call("refresh", [member, wants, 0, 0, 0])
            want = model.refresh(clock.ms, member, wants=wants, reported=0, used=0, throttled=0)
            assert _normal(got) == _normal(want)
    finally:
        client.delete(*keys(name))
