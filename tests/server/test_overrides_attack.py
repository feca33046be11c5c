"""The overrides API and CLI attacked: names and reasons that would spoof the
audit's table, rates that crashed the parser, a long name whose refusal
miscounted, an odd answer from a service, text in Redis that a table would
print raw, and a Redis that is not there."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.redis_server import RedisServer, free_port
from tests.server.conftest import RULES, client_for, make_app
from tests.server.process import RATEWARDEN

TOKEN = "s3cret"
AUTH = {"authorization": f"Bearer {TOKEN}"}
BODY = {"limits": ["5/minute"], "for": "30m", "reason": "incident 7", "by": "alice"}


def put(rules_file: Path, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """The answer to one PUT, and the list afterwards."""

    async def main() -> tuple[int, dict[str, Any], dict[str, Any]]:
        async with client_for(make_app(rules_file, token=TOKEN)) as client:
            answer = await client.put("/v1/overrides/search", json=body, headers=AUTH)
            listed = (await client.get("/v1/overrides", headers=AUTH)).json()
            return answer.status_code, answer.json(), listed

    return asyncio.run(main())


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("limits", ["²/minute"], "ASCII"),
        ("limits", "2\u0661/minute", "ASCII"),
        ("reason", "storm \u202eretsasid", "one line of printable text"),
        ("reason", "a\u2028b", "one line of printable text"),
        ("reason", "a\x9b2Jb", "one line of printable text"),
        ("by", "\u202eecila", "one line of printable text"),
        ("by", "b" * 121, "by is longer than 120 characters"),
        ("by", 7, "Expected `str`"),
    ],
)
def test_what_would_crash_or_spoof_is_a_422(
    rules_file: Path, field: str, value: object, error: str
) -> None:
    status, answer, listed = put(rules_file, {**BODY, field: value})
    assert status == 422, answer
    assert error in answer["error"]
    assert listed["overrides"] == [] == listed["audit"]


def test_a_long_name_within_the_bound_is_kept_with_the_address(rules_file: Path) -> None:
    status, answer, _ = put(rules_file, {**BODY, "by": "b" * 120})
    assert status == 200, answer
    assert answer["override"]["by"] == "b" * 120 + " (from 127.0.0.1)"


# -- the CLI ---------------------------------------------------------------------


def ratewarden(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RATEWARDEN), "override", *args], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


@pytest.fixture
def rules_yaml(tmp_path: Path) -> Path:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    return rules


def test_no_redis_is_one_line_and_exit_3(rules_yaml: Path) -> None:
    store = f"redis://127.0.0.1:{free_port()}/0"
    done = ratewarden("set", "search", "5/minute", "--for", "1m", "--reason", "r",
                      "--store", store, "--rules", str(rules_yaml))  # fmt: skip
    assert done.returncode == 3
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_a_superscript_rate_is_refused_with_exit_2(
    rules_yaml: Path, redis_single: RedisServer
) -> None:
    done = ratewarden("set", "search", "²/minute", "--for", "1m", "--reason", "r",
                      "--store", redis_single.url, "--rules", str(rules_yaml))  # fmt: skip
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr


def test_the_table_prints_what_another_writer_left_in_redis_as_one_line(
    rules_yaml: Path, redis_single: RedisServer
) -> None:
    namespace = "ratewarden"  # the CLI's: leave nothing behind
    client = redis_single.client()
    active = f"{{{namespace}:overrides}}:active"
    rule = f"x-{uuid.uuid4().hex[:6]}"
    record = {"set_at": 1, "expires_at": 99_999_999_999_999, "rule": rule,
              "limits": ["5/minute"], "file_limits": ["2/minute"],
              "reason": "\x1b[2J\x1b[31mall clear\nFAKE ROW", "by": "\u202eecila"}  # fmt: skip
    client.hset(active, rule, json.dumps(record))
    try:
        done = ratewarden("list", "--store", redis_single.url, "--rules", str(rules_yaml))
        assert done.returncode == 0, done.stderr
        assert "\x1b" not in done.stdout
        assert "\u202e" not in done.stdout
        rows = [line for line in done.stdout.splitlines() if rule in line]
        assert len(rows) == 1
        assert "FAKE ROW" in rows[0]
        assert len(done.stdout.splitlines()) == 1 + len(client.hkeys(active))
    finally:
        client.hdel(active, rule)


class _Odd(BaseHTTPRequestHandler):
    answer = b'{"overrides": [{"rule": 1}], "audit": 5}'

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(self.answer)))
        self.end_headers()
        self.wfile.write(self.answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def odd_service() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Odd)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    "answer", [b'{"overrides": [{"rule": 1}], "audit": 5}', b"[1, 2]", b'{"overrides": 5}']
)
def test_an_answer_the_cli_cannot_read_is_one_line_and_exit_3(
    odd_service: str, answer: bytes
) -> None:
    _Odd.answer = answer
    done = ratewarden("list", "--audit", "3", "--url", odd_service)
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
