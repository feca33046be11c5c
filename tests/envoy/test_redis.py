"""Envoy configs on a real Redis (a server of the tests' own): the counters
behind envoy's counting (a fixed window whose limit is never reached, read back
as a count) and the atomic counting give the same answers as on the memory store."""

from __future__ import annotations

import textwrap
import uuid

import pytest

from ratewarden import FakeClock
from ratewarden.rules import EnvoyConfig
from ratewarden.stores.redis import RedisStore
from tests.redis_server import RedisServer

CONFIG = """
    domain: {domain}
    descriptors:
      - key: user
        rate_limit: {{unit: minute, requests_per_unit: 5}}
      - key: file
        value: "docs/*"
        share_threshold: true
        rate_limit: {{unit: hour, requests_per_unit: 3}}
      - key: plan
        rate_limit: {{unit: year, requests_per_unit: 2}}
"""


@pytest.fixture
def store(redis_single: RedisServer) -> RedisStore:
    return RedisStore(redis_single.url, timeout=2.0, clock=FakeClock(1_700_000_040))


@pytest.mark.parametrize("count_denied", [True, False])
def test_counts_on_redis(store: RedisStore, count_denied: bool) -> None:
    domain = f"d{uuid.uuid4().hex}"  # the server is shared by the session's tests
    text = textwrap.dedent(CONFIG.format(domain=domain))
    cfg = EnvoyConfig.loads(text, store=store, count_denied=count_denied)
    user = [[("user", "u1")]]
    answers = [cfg.check(domain, user) for _ in range(7)]
    assert [a.overall_ok for a in answers] == [True] * 5 + [False] * 2
    decision = answers[1].decision
    assert decision is not None
    assert (decision.limit, decision.remaining) == (5, 3)
    assert 0 < decision.reset_after <= 60
    files = [cfg.check(domain, [[("file", f"docs/{i}")]]).overall_ok for i in range(5)]
    assert files == [True, True, True, False, False]  # one counter for every docs/ file
    plan = [cfg.check(domain, [[("plan", "p")]]).overall_ok for _ in range(3)]
    assert plan == [True, True, False]  # a year's counter fits Redis' exact range too
    key = f"{domain}.user"
    assert cfg.stats.value(key, "total_hits") == 7
    assert cfg.stats.value(key, "over_limit") == 2
    # after a request of 3 is denied: counted (8+3 > 5, the next of 1 denied) or not
    heavy = [[("user", "u2")]]
    cfg.check(domain, heavy, hits_addend=3)
    assert not cfg.check(domain, heavy, hits_addend=3).overall_ok
    assert cfg.check(domain, heavy).overall_ok is not count_denied
    store.close()
