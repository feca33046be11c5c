"""The RLQS harness counts what it claims: the load generator offers the rates
it is given and tallies 2xx and 429 per Envoy, the upstream counts what reaches
it per second, and real Envoys from examples/rlqs/envoy.yaml, in front of a fake
quota service (tests/system/fake_rlqs.py), allow, deny and rate-limit as that
service assigns and report the same counts back."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.system.conftest import free_port
from tests.system.fake_rlqs import Action, FakeRlqs, deny_all, token_bucket
from tests.system.rlqs_harness import (
    RLQS_CONFIG,
    Tally,
    Upstream,
    envoys,
    rlqs_run,
    rls_comparison,
    run_load,
    summary,
)


def per_second_allowed(tallies: list[Tally]) -> dict[int, int]:
    out: dict[int, int] = {}
    for tally in tallies:
        for second, (allowed, _) in tally.seconds.items():
            out[second] = out.get(second, 0) + allowed
    return out


def wait_until(check: Callable[[], bool], what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout} s")
        time.sleep(0.1)


def test_the_load_reaches_the_upstream_at_the_offered_rates(tmp_path: Path) -> None:
    with Upstream(tmp_path) as upstream:
        tallies = run_load([upstream.port] * 3, [50, 30, 20], 3)
        time.sleep(0.2)
        counts = upstream.counts()
    assert [t.sent for t in tallies] == [150, 90, 60]
    assert [t.allowed for t in tallies] == [150, 90, 60]
    assert all(t.denied == 0 and t.errors == 0 and not t.other for t in tallies)
    assert all(t.behind < 0.1 for t in tallies), [t.behind for t in tallies]
    assert sum(counts.values()) == 300
    seconds = per_second_allowed(tallies)
    assert sorted(seconds.values()) == [100, 100, 100]
    for second, n in seconds.items():  # an answer may land a moment past its second
        assert abs(counts.get(second, 0) - n) <= 2, (counts, seconds)


def test_run_load_wants_a_rate_per_envoy() -> None:
    with pytest.raises(ValueError, match="one rate per Envoy"):
        run_load([1, 2], [10], 1)


@contextmanager
def rlqs_envoys(
    tmp: Path, n: int, policy: Callable[[Mapping[str, str]], Action | None]
) -> Iterator[tuple[FakeRlqs, Upstream, list[int]]]:
    with (
        FakeRlqs(free_port(), policy) as fake,
        Upstream(tmp) as upstream,
        envoys(n, RLQS_CONFIG, upstream=upstream.port, grpc=fake.port, tmp=tmp) as gateways,
    ):
        yield fake, upstream, [gw.port for gw in gateways]


def tenant(name: str) -> dict[str, str]:
    return {"x-tenant": name}


def test_without_an_assignment_every_request_passes_and_is_reported(tmp_path: Path) -> None:
    with rlqs_envoys(tmp_path, 2, lambda bucket: None) as (fake, upstream, ports):
        tallies = run_load(ports, [40, 20], 3, headers=[tenant("acme"), tenant("globex")])
        time.sleep(0.2)
        counts = upstream.counts()
        # Envoy 1.40 reports every 5 s: wait for the reports to add up
        wait_until(lambda: fake.totals() == (180, 0),
                   f"the reports did not add up to 180 allowed ({fake.totals()})")  # fmt: skip
    assert [(t.sent, t.allowed, t.denied, t.errors) for t in tallies] == [
        (120, 120, 0, 0),
        (60, 60, 0, 0),
    ]
    assert sum(counts.values()) == 180
    buckets = {tuple(sorted(u.bucket.items())) for r in fake.reports for u in r.usages}
    api = ("name", "api")
    assert buckets == {(api, ("tenant", "acme")), (api, ("tenant", "globex"))}
    assert {r.domain for r in fake.reports} == {"envoy"}


def assigned(fake: FakeRlqs, port: int, name: str) -> None:
    """One request into the tenant's bucket, then wait until the fake service
    has heard of it (it answers the same report)."""
    run_load([port], [10], 0.1, headers=[tenant(name)])
    wait_until(lambda: any(u.bucket.get("tenant") == name for r in fake.reports for u in r.usages),
               f"no report of tenant {name}")  # fmt: skip
    time.sleep(0.2)  # the answer's way into the worker


def test_deny_all_is_tallied_as_denied_and_never_reaches_the_upstream(tmp_path: Path) -> None:
    def policy(bucket: Mapping[str, str]) -> Action | None:
        return deny_all() if bucket.get("tenant") == "blocked" else None

    with rlqs_envoys(tmp_path, 2, policy) as (fake, upstream, ports):
        assigned(fake, ports[0], "blocked")
        before = sum(upstream.counts().values())
        tallies = run_load(ports, [30, 30], 2, headers=[tenant("blocked"), tenant("free")])
        time.sleep(0.2)
        reached = sum(upstream.counts().values()) - before
    blocked, free = tallies
    assert (blocked.sent, blocked.allowed, blocked.denied, blocked.errors) == (60, 0, 60, 0)
    assert (free.sent, free.allowed, free.denied, free.errors) == (60, 60, 0, 0)
    assert blocked.denied_share == 1.0
    assert reached == 60


def test_a_token_bucket_lets_its_rate_and_burst_through(tmp_path: Path) -> None:
    def policy(bucket: Mapping[str, str]) -> Action | None:
        return token_bucket(per_second=20, burst=20) if bucket.get("tenant") == "metered" else None

    with rlqs_envoys(tmp_path, 1, policy) as (fake, upstream, ports):
        assigned(fake, ports[0], "metered")
        before = upstream.counts()
        [tally] = run_load(ports, [60], 3, headers=[tenant("metered")])
        time.sleep(0.2)
        after = upstream.counts()
    # a full bucket of 20, then 20 a second for the 3 seconds
    assert 78 <= tally.allowed <= 82, tally
    assert tally.allowed + tally.denied == tally.sent == 180
    assert tally.errors == 0
    reached = {s: n - before.get(s, 0) for s, n in after.items() if n != before.get(s, 0)}
    seconds = per_second_allowed([tally])
    assert sum(reached.values()) == tally.allowed
    for second, n in seconds.items():
        assert abs(reached.get(second, 0) - n) <= 2, (reached, seconds)
    later = [seconds[s] for s in sorted(seconds)[1:]]
    assert all(18 <= n <= 22 for n in later), seconds  # the refill, once the burst is spent


def test_the_rls_comparison_holds_the_total_each_second(tmp_path: Path) -> None:
    """The classic filter asking ``ratewarden serve`` per request: 300 a second
    offered 10:1:1, 200 a second reach the upstream, each Envoy denied alike."""
    result = rls_comparison(tmp_path, duration=3)
    per_second = [result.upstream.get(result.first + i, 0) for i in range(3)]
    assert per_second == [200, 200, 200], summary(result)
    assert [t.sent for t in result.tallies] == [750, 75, 75]
    assert all(t.errors == 0 and not t.other for t in result.tallies), summary(result)
    # every request allowed reached the upstream (the Envoys' warm-up requests come
    # before the load): on a busy machine one sent late falls into the next second,
    # a window of its own, so the count is not always 600
    reached = sum(n for second, n in result.upstream.items() if second >= result.first)
    assert sum(t.allowed for t in result.tallies) == reached, summary(result)
    assert all(0.2 < t.denied_share < 0.45 for t in result.tallies), summary(result)


def test_an_rlqs_run_counts_only_the_seconds_after_settling(tmp_path: Path) -> None:
    """The same skewed load through examples/rlqs/envoy.yaml, the fake service
    giving every Envoy 66 a second: the busy one is held to 66, the other two
    pass all their 25, and the settling second is left out of the count."""

    def policy(bucket: Mapping[str, str]) -> Action | None:
        return token_bucket(per_second=66, burst=66)

    with FakeRlqs(free_port(), policy) as fake:
        result = rlqs_run(tmp_path, fake.port, duration=3, settle=1)
    per_second = [result.upstream.get(result.first + i, 0) for i in range(3)]
    assert all(113 <= n <= 119 for n in per_second), summary(result)
    busy, *quiet = [result.window(t) for t in result.tallies]
    assert 195 <= busy[0] <= 201, summary(result)
    assert busy[0] + busy[1] == 750
    assert quiet == [(75, 0), (75, 0)], summary(result)
    assert [t.sent for t in result.tallies] == [1000, 100, 100]
