"""The service logs what a ``log_only`` rule would deny: the engine's line, once
per rule and key, as a JSON line with its fields."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from ratewarden.server._logging import JSONFormatter
from tests.server.conftest import client_for, make_app


def test_the_service_logs_a_log_only_rule_once_per_key(
    rules_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "ratewarden.rules")
    app = make_app(rules_file)  # "watched": 4/minute, log_only, one counter for all

    async def main() -> list[bool]:
        async with client_for(app) as client:
            body = {"attributes": {"path": "/api/watched", "user": "u1"}}
            answers = [(await client.post("/v1/check", json=body)).json() for _ in range(8)]
        return [a["allowed"] for a in answers]

    assert asyncio.run(main()) == [True] * 8
    records = [r for r in caplog.records if r.name == "ratewarden.rules"]
    assert len(records) == 1
    line = json.loads(JSONFormatter().format(records[0]))
    assert line["level"] == "warning"
    assert (line["event"], line["rule"], line["key"], line["limit_size"]) == (
        "log_only", "watched", "", 4,
    )  # fmt: skip


def test_fields_never_replace_the_lines_own() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    record.fields = {"message": "forged", "level": "error", "rule": "r"}
    line = json.loads(JSONFormatter().format(record))
    assert (line["message"], line["level"], line["rule"]) == ("hello", "info", "r")
