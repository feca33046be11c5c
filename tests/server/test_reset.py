"""``DELETE /v1/keys/{key}`` forgets a key in the limits in force: a rule's
override, an adaptive limit's effective size, and the rule file's limits alike
(the engine's own limiters, tests/rules/ has the shards and two-tier counts)."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ratewarden import AsyncMemoryStore, FakeClock
from ratewarden.server import App, Service
from tests.server.conftest import client_for

RULES = textwrap.dedent("""
    rules:
      - name: api
        rate: 10/minute
        algorithm: fixed_window
        by: user
      - name: busy
        rate: 10/minute
        algorithm: sliding_window_counter
        by: user
        adaptive: {signal: p99_ms, good: 200, bad: 1000, floor: 20%}
        match: {paths: /busy}
""")
START = 1_700_000_040.0


def make(tmp_path: Path) -> App:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return App(Service(path, AsyncMemoryStore(clock=FakeClock(START))))


async def allowed(client: Any, path: str, times: int) -> list[bool]:
    check = {"attributes": {"user": "bob", "path": path}}
    return [(await client.post("/v1/check", json=check)).json()["allowed"] for _ in range(times)]


@pytest.mark.parametrize("rule", [None, "api"])
def test_a_reset_under_an_override_resets_the_override_s_count(
    tmp_path: Path, rule: str | None
) -> None:
    async def main() -> tuple[list[bool], Any, list[bool]]:
        async with client_for(make(tmp_path)) as client:
            override = {"limits": "3/minute", "for": "10m", "reason": "a test"}
            assert (await client.put("/v1/overrides/api", json=override)).status_code == 200
            before = await allowed(client, "/", 4)
            params = {} if rule is None else {"rule": rule}
            reset = await client.delete("/v1/keys/bob", params=params)
            return before, reset.json(), await allowed(client, "/", 1)

    before, reset, after = asyncio.run(main())
    assert before == [True, True, True, False]
    assert reset == {"key": "bob", "limits_reset": 2 if rule is None else 1}
    assert after == [True]


def test_a_reset_of_an_adaptive_limit_resets_its_count(tmp_path: Path) -> None:
    async def main() -> tuple[list[bool], Any, list[bool]]:
        async with client_for(make(tmp_path)) as client:
            load = await client.put("/v1/load/p99_ms", json={"value": 1000})
            assert load.json()["limits"]["busy"]["effective_limit"] == 2
            before = await allowed(client, "/busy", 3)
            reset = await client.delete("/v1/keys/bob", params={"rule": "busy"})
            return before, reset.json(), await allowed(client, "/busy", 1)

    before, reset, after = asyncio.run(main())
    assert before == [True, True, False]
    assert reset == {"key": "bob", "limits_reset": 1}
    assert after == [True]


def test_a_reset_of_a_rule_nobody_names_is_a_404(tmp_path: Path) -> None:
    async def main() -> Any:
        async with client_for(make(tmp_path)) as client:
            return await client.delete("/v1/keys/bob", params={"rule": "nope"})

    answer = asyncio.run(main())
    assert answer.status_code == 404
    assert answer.json() == {"error": "no rule named 'nope'"}
