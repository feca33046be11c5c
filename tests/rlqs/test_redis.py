"""Several ratewardens serving one fleet of proxies through the coordinator in
Redis: a proxy on any of them, the bucket's total held across them all."""

from __future__ import annotations

import asyncio
import uuid

import redis.asyncio as aredis

from ratewarden.primitives import FakeClock
from ratewarden.rlqs import QuotaService, QuotaStream, RedisCoordinators, Usage, bucket_rules
from ratewarden.rules import loads
from tests.redis_server import RedisServer

RULES = """
rlqs:
  - name: api
    domain: envoy
    bucket: {name: api, tenant: "*"}
    rate: 120/second
"""


def rate(actions: list) -> float:  # type: ignore[type-arg]
    [action] = actions
    return 0.0 if action.assignment.kind == "deny" else float(action.assignment.per_second)


def test_proxies_on_three_instances_share_one_total(redis_single: RedisServer) -> None:
    tenant = {"name": "api", "tenant": uuid.uuid4().hex[:12]}

    async def main() -> tuple[list[float], float, int]:
        client = aredis.Redis(port=redis_single.port)
        rules = bucket_rules(loads(RULES).file.rlqs)
        # the streams' clock (reports a second apart); the coordinator keeps Redis's
        clock = FakeClock()
        instances = [QuotaService(rules, RedisCoordinators(client), clock=clock) for _ in range(3)]
        told: dict[int, float] = {}
        streams: list[QuotaStream] = []
        for i, instance in enumerate(instances):
            stream = instance.open()
            stream.on_push = lambda actions, i=i: told.__setitem__(i, rate(actions))
            streams.append(stream)
        try:
            # each proxy wants more than a third; they join one after another
            for _ in range(4):
                clock.advance(1.0)
                for i, stream in enumerate(streams):
                    told[i] = rate(await stream.report("envoy", [Usage(tenant, 50, 50)]))
                    assert sum(told.values()) <= 120 + 1e-9
                await asyncio.sleep(0.05)
            status = await instances[0].coordinators.show(
                f"rlqs/envoy/name:api/tenant:{tenant['tenant']}"
            )
            assert status is not None
            return [told[i] for i in range(3)], status.granted, len(status.members)
        finally:
            for stream in streams:
                stream.close()
            await client.aclose()

    rates, granted, members = asyncio.run(main())
    assert members == 3
    assert granted <= 120
    assert min(rates) >= 35  # each near its fair third once all have reported twice
    assert sum(rates) <= 120
