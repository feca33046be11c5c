"""What an operator sees of the quota buckets on the memory store: /v1/quotas,
/metrics, and a reload that changes a total."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ratewarden.primitives import FakeClock
from ratewarden.rlqs import Usage
from ratewarden.server import App
from tests.rlqs import ACME, API_RULES
from tests.server.conftest import client_for, make_app

RULES = API_RULES


def test_buckets_are_listed_shown_and_counted_by_entry_never_by_proxy(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    app: App = make_app(rules)
    quotas = app.service.rules.quotas

    async def main() -> tuple[dict[str, Any], dict[str, Any], str]:
        one, two = quotas.open(), quotas.open()
        await one.report("envoy", [Usage(ACME, 7, 3)])
        await two.report("envoy", [Usage(ACME, 2, 0)])
        async with client_for(app) as http:
            listed = (await http.get("/v1/quotas")).json()
            shown = (await http.get("/v1/quotas/rlqs/envoy/name:api/tenant:acme")).json()
            text = (await http.get("/metrics")).text
        one.close()
        two.close()
        return listed, shown, text

    listed, shown, text = asyncio.run(main())
    [bucket] = listed["quotas"]
    assert bucket["name"] == "rlqs/envoy/name:api/tenant:acme"
    assert bucket["total"] == 200
    assert bucket["members"] == 2
    assert bucket["granted"] <= 200
    assert len(shown["members"]) == 2
    assert 'ratewarden_rlqs_requests_total{outcome="allowed",rule="api"} 9.0' in text
    assert 'ratewarden_rlqs_requests_total{outcome="denied",rule="api"} 3.0' in text
    assert "ratewarden_rlqs_streams 2.0" in text
    assert 'ratewarden_quota_total{resource="rlqs/envoy/name:api/tenant:acme"} 200.0' in text
    assert "ratewarden_quota_member_" not in text  # no proxy's id unless asked


def test_a_reload_puts_a_new_total_in_force_at_the_next_report(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    app: App = make_app(rules)
    quotas = app.service.rules.quotas

    clock = quotas.clock = FakeClock()  # the streams' clock: a report a second later

    async def main() -> tuple[float, float]:
        stream = quotas.open()
        [before] = await stream.report("envoy", [Usage(ACME, 1, 0)])
        rules.write_text(RULES.replace("200/second", "40/second"))
        await app.service.reload()
        clock.advance(1.0)
        [after] = await stream.report("envoy", [Usage(ACME, 500, 500)])
        assert before.assignment is not None
        assert after.assignment is not None
        return before.assignment.per_second, after.assignment.per_second

    before, after = asyncio.run(main())
    assert before == 200
    assert after == 40


def test_a_bad_rlqs_entry_in_a_reload_keeps_what_is_in_force(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    app: App = make_app(rules)

    async def main() -> int:
        async with client_for(app) as http:
            rules.write_text(RULES.replace("fair_share", "x").replace("200/second", "1/fortnight"))
            answer = await http.post("/v1/reload")
            assert "fortnight" in answer.text
            return answer.status_code

    assert asyncio.run(main()) == 422
    [rule] = app.service.rules.quotas.rules
    assert rule.quota.rate.limit == 200
