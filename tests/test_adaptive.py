"""Adaptive limits: the price of a request under a load signal, read once per
interval, smoothed, with a dead-band; Decisions told in requests; the rule
file's ``adaptive:``; an override's rate scaled as the file's is."""

from __future__ import annotations

import itertools
import json
import math
import textwrap
from pathlib import Path

import pytest

from ratewarden import Adaptive, ConfigurationError, FakeClock, Limiter, MemoryStore, hit_many
from ratewarden._adaptive import Scale, parse_floor
from ratewarden.cli import main
from ratewarden.rules import RuleEngine, RuleFileError, loads
from ratewarden.stores.redis import RedisStore
from tests.redis_server import LIVE, RedisServer

START = 1_700_000_040.0


class Feed:
    """A load signal a test sets, counting its reads."""

    def __init__(self, value: float | None = None) -> None:
        self.value, self.reads = value, 0

    def __call__(self) -> float | None:
        self.reads += 1
        return self.value


def limiter(feed: Feed, clock: FakeClock, rate: str = "10/minute", **options: object) -> Limiter:
    settings: dict[str, object] = {"good": 200, "bad": 1000, "floor": "20%", "smoothing": 1.0}
    settings.update(options)
    adaptive = Adaptive(feed, **settings)  # type: ignore[arg-type]
    return Limiter(rate, store=MemoryStore(clock=clock), algorithm="fixed_window",
                   adaptive=adaptive, name="api")  # fmt: skip


def test_the_limit_scales_between_good_and_bad() -> None:
    clock = FakeClock(START)
    feed = Feed()
    lim = limiter(feed, clock)
    assert lim.effective_limit == 10  # no value yet: the configured limit
    for value, expected in [(200, 10), (600, 6), (1000, 2), (5000, 2), (0, 10)]:
        feed.value = value
        clock.advance(1)
        assert lim.effective_limit == expected, value


def test_decisions_are_told_in_requests_and_counts_apply_at_once() -> None:
    clock = FakeClock(START)
    feed = Feed(200)
    lim = limiter(feed, clock)
    assert [lim.hit("k").remaining for _ in range(4)] == [9, 8, 7, 6]
    # 6 of 10: the 4 counted used 40% of the window, which leaves 60% of 6
    feed.value = 600
    clock.advance(1)
    decisions = [lim.hit("k") for _ in range(4)]
    assert [(d.allowed, d.limit, d.remaining) for d in decisions] == [
        (True, 6, 2), (True, 6, 1), (True, 6, 0), (False, 6, 0)
    ]  # fmt: skip
    assert lim.peek("k").limit == 6


def test_the_signal_is_read_once_per_interval() -> None:
    clock = FakeClock(START)
    feed = Feed(600)
    lim = limiter(feed, clock, interval=2.0)
    for _ in range(100):
        lim.hit("k")
    assert feed.reads == 1
    clock.advance(1.999)
    lim.hit("k")
    assert feed.reads == 1
    clock.advance(0.001)
    lim.hit("k")
    assert feed.reads == 2


def test_smoothing_and_the_dead_band_keep_a_noisy_signal_from_flickering() -> None:
    """A signal that jumps between 550 and 650 every second (the limit would go
    6, 5, 6, 5 unsmoothed) holds one limit once smoothed with a dead-band; a
    real step still comes through within a few readings."""
    clock = FakeClock(START)
    noisy = Feed()
    plain = Feed()
    smoothed = Scale(Adaptive(noisy, good=200, bad=1000, floor=0.2, smoothing=0.3,
                              dead_band=0.05), clock, 10_000)  # fmt: skip
    unsmoothed = Scale(Adaptive(plain, good=200, bad=1000, floor=0.2, smoothing=1,
                                dead_band=0), clock, 10_000)  # fmt: skip
    limits: list[int] = []
    raw: list[int] = []
    for second in range(40):
        noisy.value = plain.value = 550 if second % 2 else 650
        smoothed.unit()
        unsmoothed.unit()
        limits.append(smoothed.limit(10_000))
        raw.append(unsmoothed.limit(10_000))
        clock.advance(1)
    assert len(set(raw[10:])) == 2  # flickers
    assert len(set(limits[10:])) == 1  # holds
    changes = sum(a != b for a, b in itertools.pairwise(limits))
    assert changes <= 2
    noisy.value = 0  # the load falls for good: the limit follows over a few readings
    rising = []
    for _ in range(6):
        smoothed.unit()
        rising.append(smoothed.limit(10_000))
        clock.advance(1)
    assert rising == sorted(rising)
    assert rising[0] < 10
    assert (smoothed.factor, rising[-1]) == (1.0, 10)  # exactly the full limit


def test_a_failing_or_odd_signal_keeps_the_limit(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(START)
    feed = Feed(1000)
    lim = limiter(feed, clock)
    assert lim.effective_limit == 2

    def broken() -> float:
        raise RuntimeError("metrics backend down")

    for bad in (math.nan, math.inf, "high", True):
        feed.value = bad  # type: ignore[assignment]
        clock.advance(1)
        assert lim.effective_limit == 2
    lim.scale.adaptive = Adaptive(broken, good=200, bad=1000, floor=0.2)  # type: ignore[union-attr]
    clock.advance(1)
    assert lim.effective_limit == 2
    assert "metrics backend down" in caplog.text
    assert "not a finite number" in caplog.text


def test_the_floor_is_never_below_one_request() -> None:
    clock = FakeClock(START)
    lim = limiter(Feed(1000), clock, rate="3/minute", floor="1%")
    assert lim.effective_limit == 1
    assert lim.hit("k").allowed
    assert not lim.hit("k").allowed


def test_several_tiers_tell_the_adaptive_one_in_requests() -> None:
    clock = FakeClock(START)
    store = MemoryStore(clock=clock)
    adaptive = Adaptive(Feed(1000), good=200, bad=1000, floor=0.2, smoothing=1)
    busy = Limiter("10/minute", store=store, algorithm="fixed_window", adaptive=adaptive,
                   name="busy")  # fmt: skip
    plain = Limiter("100/minute", store=store, algorithm="fixed_window", name="plain")
    decisions = [hit_many([(busy, "k"), (plain, "k")]) for _ in range(3)]
    assert [(d.allowed, d.rule, d.limit, d.remaining) for d in decisions] == [
        (True, "busy", 2, 1), (True, "busy", 2, 0), (False, "busy", 2, 0)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"algorithm": "sliding_window_log"}, "sliding_window_log"),
        ({"adaptive": "yes"}, "Adaptive(...)"),
    ],
)
def test_limiter_refuses(options: dict[str, object], message: str) -> None:
    settings: dict[str, object] = {
        "adaptive": Adaptive(Feed(), good=1, bad=2),
        "algorithm": "fixed_window",
    }
    settings.update(options)
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Limiter("10/minute", **settings)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"good": 5, "bad": 5}, "must differ"),
        ({"floor": "0%"}, "floor"),
        ({"floor": 1.5}, "floor"),
        ({"floor": "ten"}, "floor"),
        ({"interval": 0}, "interval"),
        ({"smoothing": 0}, "smoothing"),
        ({"dead_band": 1}, "dead_band"),
        ({"good": math.nan}, "finite"),
    ],
)
def test_adaptive_refuses(settings: dict[str, object], message: str) -> None:
    options: dict[str, object] = {"good": 200, "bad": 1000}
    options.update(settings)
    with pytest.raises(ConfigurationError, match=message):
        Adaptive(Feed(), **options)  # type: ignore[arg-type]


def test_parse_floor() -> None:
    assert parse_floor("10%") == pytest.approx(0.1)
    assert parse_floor(0.25) == 0.25
    assert parse_floor(1) == 1.0


RULES = textwrap.dedent("""
    rules:
      - name: api
        rate: [10/minute, 100/hour]
        algorithm: fixed_window
        adaptive: {signal: p99_ms, good: 200, bad: 1000, floor: 20%, smoothing: 1}
""")


def test_engine_scales_every_rate_and_an_override_too() -> None:
    clock = FakeClock(START)
    engine = RuleEngine(loads(RULES), MemoryStore(clock=clock))
    engine.set_load("p99_ms", 1000)
    outcome = engine.check({})
    assert outcome.headers()[:2] == [("X-RateLimit-Limit", "2"), ("X-RateLimit-Remaining", "1")]
    assert engine.effective_limits() == {"api@10/minute": (10, 2), "api@100/hour": (100, 20)}
    engine.set_override("api", ["50/minute"], duration=60, reason="launch")
    # the override's 50/minute takes the minute tier's place, under its name, scaled
    assert engine.effective_limits()["api@10/minute"] == (50, 10)
    outcome = engine.check({})
    policy = dict(outcome.headers())["RateLimit-Policy"]
    assert policy == '"api@10/minute";q=10;w=60, "api@100/hour";q=20;w=3600'
    with pytest.raises(ConfigurationError, match="no rule reads the signal 'queue'"):
        engine.set_load("queue", 3)


@pytest.mark.parametrize(
    ("adaptive", "extra", "message"),
    [
        ("{signal: p99, good: 1, bad: 1}", "", "good and bad must differ"),
        ("{signal: p99, good: 1, bad: 2, floor: 200%}", "", "floor is a share"),
        ("{signal: 'no good', good: 1, bad: 2}", "", "bad signal name"),
        ("{signal: p99, good: 1, bad: 2, smoothing: 2}", "", "smoothing"),
        ("{signal: p99, good: 1, bad: 2}", "algorithm: sliding_window_log,", "one entry per unit"),
        ("{signal: p99, good: 1, bad: 2}", "action: queue, queue: 3,", "queue"),
        ("{signal: p99, good: 1, bad: 2, wobble: 3}", "", "wobble"),
    ],
)
def test_rule_file_refuses(adaptive: str, extra: str, message: str) -> None:
    text = f"rules:\n  - {{name: api, rate: 10/second, {extra} adaptive: {adaptive}}}\n"
    with pytest.raises(RuleFileError, match=message) as caught:
        loads(text)
    assert "api" in str(caught.value)


def test_explain_shows_the_limit_a_load_leaves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    assert main(["explain", str(path), "path=/", "--load", "p99_ms=600"]) == 0
    out = capsys.readouterr().out
    assert "10/minute -> 6 at p99_ms=600, 100/hour -> 60 at p99_ms=600" in out
    assert main(["explain", str(path), "path=/", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["rules"][0]["limits"]
    assert listed == ["10/minute (adaptive: p99_ms not fed)", "100/hour (adaptive: p99_ms not fed)"]
    assert main(["explain", str(path), "path=/", "--load", "p99_ms=lots"]) == 2
    assert "--load takes SIGNAL=NUMBER, got 'p99_ms=lots'" in capsys.readouterr().err


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window_counter", "gcra"])
def test_the_redis_store_counts_the_price(redis_single: RedisServer, algorithm: str) -> None:
    store = RedisStore(redis_single.url, timeout=LIVE)
    adaptive = Adaptive(Feed(1000), good=200, bad=1000, floor=0.2)
    lim = Limiter("10/minute", store=store, algorithm=algorithm, adaptive=adaptive,
                  name=f"adaptive-{algorithm}")  # fmt: skip
    decisions = [lim.hit("k") for _ in range(3)]
    assert [(d.allowed, d.limit, d.remaining) for d in decisions] == [
        (True, 2, 1), (True, 2, 0), (False, 2, 0)
    ]  # fmt: skip
    store.close()
