"""Hot-key sharding on the memory store: a key's limit split into exact shards
never admits more than the limit, leaves less than shards * cost unused, asks a
shard known full no more, and works in every call a limit offers."""

from __future__ import annotations

import asyncio
from binascii import crc_hqx
from collections import Counter
from typing import Any, Unpack

import pytest

from ratewarden import (
    AsyncLimiter,
    AsyncMemoryStore,
    ConfigurationError,
    FakeClock,
    Limiter,
    MemoryStore,
    ahit_many,
    hit_many,
)
from ratewarden._rate import Rate
from ratewarden.algorithms import Algorithm
from ratewarden.rules import AsyncRuleEngine, RuleEngine, RuleFileError, loads
from ratewarden.stores.base import BindOptions, Bound
from ratewarden.stores.shards import Shards, split

ALGORITHMS = [
    "fixed_window", "sliding_window_counter", "sliding_window_log",
    "token_bucket", "leaky_bucket", "gcra",
]  # fmt: skip


class Counting(MemoryStore):
    """A memory store that counts the calls its limits take, per key prefix."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.calls: Counter[str] = Counter()
        self.many = 0

    def bind(self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]) -> Bound:
        hit, peek, reset, tier = super().bind(algorithm, rate, **options)
        prefix = options["prefix"]

        def counted_hit(key: str, cost: int = 1) -> Any:
            self.calls[prefix] += 1
            return hit(key, cost)

        return Bound(counted_hit, peek, reset, tier)

    def hit_many(self, checks: Any) -> Any:
        self.many += 1
        return super().hit_many(checks)

    @property
    def total(self) -> int:
        return sum(self.calls.values())


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_800_000_000.0)  # a whole minute: windows start here


@pytest.fixture
def store(clock: FakeClock) -> Counting:
    return Counting(clock)


def test_split_spreads_the_remainder_over_the_first_shards() -> None:
    assert split(100, 6) == [17, 17, 17, 17, 16, 16]
    assert split(12, 6) == [2] * 6
    assert sum(split(1001, 256)) == 1001


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_sharded_key_admits_its_limit_exactly(store: Counting, algorithm: str) -> None:
    limiter = Limiter("100/minute", store=store, algorithm=algorithm, name="a", shards=6)
    decisions = [limiter.hit("k") for _ in range(300)]
    assert sum(d.allowed for d in decisions) == 100  # every shard full, none over
    assert {d.limit for d in decisions} == {100}  # the key's limit, not a shard's
    assert all(d.rule == "a" for d in decisions)


@pytest.mark.parametrize("shards", [2, 6, 8])
def test_the_unused_part_is_less_than_shards_times_cost(store: Counting, shards: int) -> None:
    limiter = Limiter("100/minute", store=store, algorithm="fixed_window", shards=shards)
    admitted = 0
    for _ in range(200):
        admitted += 7 * limiter.hit("k", 7).allowed
    assert 100 - shards * 7 < admitted <= 100


def test_a_denial_tries_the_next_shard(store: Counting) -> None:
    limiter = Limiter("60/minute", store=store, algorithm="fixed_window", shards=6)
    assert isinstance(limiter._tier, Shards)
    limiter._tier._turn = lambda: 0  # every check starts at shard 0
    assert sum(limiter.hit("k").allowed for _ in range(60)) == 60
    # each shard asked until full, and once more (denied, remembered as full)
    assert store.total == 60 + 5


def test_checks_rotate_over_the_shards(store: Counting) -> None:
    limiter = Limiter("6000/minute", store=store, algorithm="fixed_window", shards=6)
    for _ in range(600):
        assert limiter.hit("k").allowed
    assert sorted(store.calls.values()) == [100] * 6


def test_a_full_shard_is_not_asked_again_until_its_retry_after(
    store: Counting, clock: FakeClock
) -> None:
    limiter = Limiter("60/minute", store=store, algorithm="fixed_window", shards=6)
    for _ in range(60):
        assert limiter.hit("k").allowed
    before = store.total
    denied = limiter.hit("k")  # asks all six shards, each full
    assert not denied.allowed
    assert store.total == before + 6
    assert denied.retry_after == pytest.approx(60.0)
    assert denied.remaining == 0
    for _ in range(1000):
        again = limiter.hit("k")
        assert not again.allowed
        assert again.retry_after == pytest.approx(60.0)
    assert store.total == before + 6  # known full: denied here, no shard asked
    clock.advance(60)
    assert limiter.hit("k").allowed  # the window turned: asked again


def test_a_shard_full_for_a_large_cost_is_asked_for_a_small_one(store: Counting) -> None:
    limiter = Limiter("12/minute", store=store, algorithm="fixed_window", shards=2)
    assert limiter.hit("k", 5).allowed  # 1 of 6 left on one shard
    assert limiter.hit("k", 5).allowed  # and on the other
    assert not limiter.hit("k", 5).allowed
    before = store.total
    assert limiter.hit("k", 1).allowed
    assert store.total == before + 1


def test_a_cost_above_every_shard_is_denied_forever(store: Counting) -> None:
    limiter = Limiter("12/minute", store=store, algorithm="fixed_window", shards=2)
    denied = limiter.hit("k", 7)
    assert not denied.allowed
    assert denied.retry_after == float("inf")
    assert limiter.hit("k", 6).allowed


def test_peek_counts_nothing_and_reset_forgets_every_shard(
    store: Counting, clock: FakeClock
) -> None:
    limiter = Limiter("12/minute", store=store, algorithm="fixed_window", shards=3)
    assert limiter.peek("k").allowed
    assert sum(limiter.hit("k").allowed for _ in range(20)) == 12
    assert not limiter.peek("k").allowed
    limiter.reset("k")
    assert limiter.peek("k").allowed
    assert sum(limiter.hit("k").allowed for _ in range(20)) == 12  # all of it, not a part


def test_acquire_waits_for_a_shard_with_room(clock: FakeClock) -> None:
    limiter = Limiter("6/second", store=MemoryStore(clock=clock), algorithm="gcra", shards=3)
    start = clock.time_ns()
    for _ in range(6):
        limiter.acquire("k", max_wait=0)
    decision = limiter.acquire("k", max_wait=5)
    assert decision.allowed
    waited = (clock.time_ns() - start) / 1e9
    assert 0 < waited <= 0.5 + 1e-6  # each shard drips one per half second


def test_hit_many_tries_the_next_shard_and_counts_a_denial_nowhere(store: Counting) -> None:
    hot = Limiter("6/minute", store=store, algorithm="fixed_window", name="hot", shards=3)
    assert isinstance(hot._tier, Shards)
    hot._tier._turn = lambda: 0  # every check starts at shard 0: the rest by trying on
    other = Limiter("100/minute", store=store, algorithm="fixed_window", name="other")
    assert [hit_many([(other, "u"), (hot, "u")]).allowed for _ in range(8)] == [True] * 6 + [
        False
    ] * 2
    assert other.peek("u").remaining == 94  # the denied ones counted nowhere
    tight = Limiter("2/minute", store=store, algorithm="fixed_window", name="tight")
    calls = store.many
    hot._tier._turn = lambda: 1  # a shard with room for "v"
    denied = hit_many([(tight, "v"), (hot, "v")])
    assert denied.allowed
    hit_many([(tight, "v"), (hot, "v")])
    denied = hit_many([(tight, "v"), (hot, "v")])
    assert not denied.allowed
    assert denied.rule == "tight"
    assert store.many == calls + 3  # another tier denied: no shard to try instead
    assert hot.peek("v").limit == 6


def test_hit_many_is_denied_here_when_the_key_is_known_full(store: Counting) -> None:
    hot = Limiter("6/minute", store=store, algorithm="fixed_window", name="hot", shards=3)
    other = Limiter("100/minute", store=store, algorithm="fixed_window", name="other")
    for _ in range(7):
        hot.hit("u")
    calls = store.many
    denied = hit_many([(other, "u"), (hot, "u")])
    assert not denied.allowed
    assert denied.rule == "hot"
    assert store.many == calls


def test_async_twins(clock: FakeClock) -> None:
    async def main() -> None:
        store = AsyncMemoryStore(clock=clock)
        hot = AsyncLimiter("60/minute", store=store, algorithm="fixed_window", name="h", shards=6)
        other = AsyncLimiter("100/minute", store=store, algorithm="fixed_window", name="o")
        admitted = [(await hot.hit("k")).allowed for _ in range(100)]
        assert sum(admitted) == 60
        assert not (await hot.peek("k")).allowed
        await hot.reset("k")
        assert (await hot.acquire("k", max_wait=0)).allowed
        together = [(await ahit_many([(hot, "u"), (other, "u")])).allowed for _ in range(80)]
        assert sum(together) == 60

    asyncio.run(main())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"shards": 0}, "shards must be an integer from 1 to 256"),
        ({"shards": 257}, "shards must be an integer from 1 to 256"),
        ({"shards": True}, "shards must be an integer"),
        ({"shards": 2.0}, "shards must be an integer"),
        ({"shards": 200}, "needs a limit of at least 200"),
        ({"shards": 4, "burst": 3, "algorithm": "gcra"}, "needs a burst of at least 4"),
        ({"shards": 4, "name": "x{tag}"}, "must not contain braces"),
        ({"promote_at": 100}, "promote_at needs shards"),
        ({"shards": 4, "promote_at": 0}, "promote_at must be finite and > 0"),
        ({"shards": 4, "promote_at": "fast"}, "promote_at must be checks per second"),
    ],
)
def test_bad_options(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Limiter("100/minute", **options)


def test_one_shard_is_the_plain_limit(store: Counting) -> None:
    plain = Limiter("10/minute", store=store, algorithm="fixed_window", name="p")
    single = Limiter("10/minute", store=store, algorithm="fixed_window", name="p", shards=1)
    assert plain.hit("k").remaining == 9
    assert single.hit("k").remaining == 8  # the same counter
    assert "shards" not in repr(single)
    assert "shards=4" in repr(Limiter("10/minute", shards=4))


def test_a_keys_shards_spread_evenly_round_the_slots() -> None:
    limiter = Limiter("100/minute", shards=6)
    shards = limiter._tier
    assert isinstance(shards, Shards)
    starts = set()
    for i in range(200):
        key = f"user-{i}"
        slots = [_slot(limiter.key_prefix + shards.key(key, s)) for s in range(6)]
        thirds = Counter(slot * 3 // 16384 for slot in slots)
        assert sorted(thirds.values()) == [2, 2, 2], slots  # 2 per master of 3
        starts.add(slots[0] // 1024)
    assert len(starts) == 16  # different keys start at different places


def _slot(key: str) -> int:
    start = key.index("{")
    tag = key[start + 1 : key.index("}", start)]
    return crc_hqx(tag.encode(), 0) % 16384


def test_promotion_moves_a_busy_key_to_its_shards_and_back(
    store: Counting, clock: FakeClock
) -> None:
    limiter = Limiter(
        "100000/minute", store=store, algorithm="fixed_window", name="p", shards=4, promote_at=50
    )
    plain = Limiter("100000/minute", store=store, algorithm="fixed_window", name="p")
    shards = limiter._tier
    assert isinstance(shards, Shards)

    def second(checks: int, key: str = "k") -> None:
        for _ in range(checks):
            assert limiter.hit(key).allowed
            clock.advance(1 / checks)

    second(40)
    second(40)
    assert shards.promoted() == []
    assert plain.peek("k").remaining == 100000 - 80  # on the key's own counter
    second(60)
    second(60)
    assert shards.promoted() == ["k"]
    whole = plain.peek("k").remaining
    second(30)  # judged at the next check: above half the threshold, it stays
    second(20)
    assert shards.promoted() == ["k"]
    assert plain.peek("k").remaining == whole  # counted on the shards
    second(20)  # the 20-a-second one judged: back to the key's own counter
    assert shards.promoted() == []


RULES = """
rules:
  - {name: hot, rate: 60/minute, algorithm: fixed_window, shards: 6, by: user}
  - {name: watch, rate: 30/minute, algorithm: fixed_window, shards: 3, by: user,
     action: log_only}
"""


def test_rule_files_turn_it_on(clock: FakeClock) -> None:
    engine = RuleEngine(loads(RULES), MemoryStore(clock=clock))
    outcomes = [engine.check({"user": "u"}) for _ in range(80)]
    assert sum(o.allowed for o in outcomes) == 60
    assert sum(o.shadow is not None and o.shadow.allowed for o in outcomes) == 30
    assert outcomes[0].decision is not None
    assert outcomes[0].decision.limit == 60
    assert [type(limiter._tier) for limiter in engine._bound.limiters] == [Shards, Shards]


def test_async_rule_engine(clock: FakeClock) -> None:
    async def main() -> int:
        engine = AsyncRuleEngine(loads(RULES), AsyncMemoryStore(clock=clock))
        return sum([(await engine.acheck({"user": "u"})).allowed for _ in range(80)])

    assert asyncio.run(main()) == 60


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("{name: a, rate: 100/minute, shards: 0}", "shards must be an integer from 1 to 256"),
        ("{name: a, rate: 100/minute, shards: 300}", "shards must be an integer from 1 to 256"),
        ("{name: a, rate: [100/minute, 5/second], shards: 8}", "needs a limit of at least 8"),
        ("{name: a, rate: 100/minute, algorithm: gcra, burst: 4, shards: 8}", "a burst of at"),
        ("{name: a, rate: 100/minute, shards: many}", "Expected `int"),
    ],
)
def test_rule_file_errors(rule: str, message: str) -> None:
    with pytest.raises(RuleFileError, match="field 'shards'") as error:
        loads(f"rules: [{rule}]")
    assert message in str(error.value)
