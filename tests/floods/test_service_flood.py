"""A flood of distinct keys at ``ratewarden serve --max-keys N`` over HTTP, in
batches of 1,000 checks (the fastest way in: bench/flood.py measures it, and
runs the same at 10 million keys): the server's RSS stops growing once the
bound is reached, the oldest keys are forgotten, and a legitimate user asking
between the batches is admitted exactly its limit.

Rates are 5/hour token buckets on the server's real clock: no token comes back
within the test, so "exactly 5" is exact, and no flood key expires, so the
bound alone keeps memory in check.
"""

from __future__ import annotations

import http.client
import json
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.server.process import Served, serving

N = 10_000
BATCH = 1000
FLOOD = 12 * N
EVERY = N // 10  # flood keys between two asks of a legitimate client
LIMIT = 5
# see tests/floods/test_library_flood.py
UNBOUNDED_BYTES_PER_KEY = 100

RULES = textwrap.dedent(f"""
    version: 1
    rules:
      - name: per-user
        rate: {LIMIT}/hour
        algorithm: token_bucket
        by: user
      - name: login
        rate: {LIMIT}/hour
        algorithm: token_bucket
        by: ip
        match: {{paths: /login}}
""")
LOGIN_IPS = ("203.0.113.1", "203.0.113.2", "203.0.113.3")


@dataclass
class Flood:
    user_admitted: int = 0
    login_admitted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LOGIN_IPS, 0))
    rss: list[int] = field(default_factory=list)  # after each batch
    first_key_remaining: int = -1  # flood-0 asked again after the flood
    log: list[str] = field(default_factory=list)


def rss_of(pid: int) -> int:
    match = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    if match is None:
        pytest.fail(f"no VmRSS in /proc/{pid}/status: these tests need Linux's /proc")
    return int(match[1]) * 1024


def send(connection: http.client.HTTPConnection, path: str, body: bytes) -> bytes:
    connection.request("POST", path, body, {"content-type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    assert response.status == 200, (path, response.status, data[:300])
    return data


def check(connection: http.client.HTTPConnection, **attributes: str) -> dict[str, object]:
    answer = json.loads(
        send(connection, "/v1/check", json.dumps({"attributes": attributes}).encode())
    )
    assert isinstance(answer, dict)
    return answer


def run_flood(served: Served) -> Flood:
    result = Flood()
    connection = http.client.HTTPConnection("127.0.0.1", served.http, timeout=30)
    try:
        for start in range(0, FLOOD, BATCH):
            if start % EVERY == 0:
                result.user_admitted += bool(check(connection, user="legit")["allowed"])
                for ip in LOGIN_IPS:
                    answer = check(connection, ip=ip, path="/login")
                    result.login_admitted[ip] += bool(answer["allowed"])
            checks = b",".join(b'{"attributes":{"user":"flood-%d"}}' % i
                               for i in range(start, start + BATCH))  # fmt: skip
            body = send(connection, "/v1/check/batch", b'{"checks":[' + checks + b"]}")
            # each key is new, or forgotten: all admitted (counted, not decoded: 400 kB)
            assert body.count(b'"allowed":true') == BATCH, body[:300]
            result.rss.append(rss_of(served.process.pid))
        first = check(connection, user="flood-0")
        result.first_key_remaining = int(first["remaining"])  # type: ignore[call-overload]
    finally:
        connection.close()
    return result


@pytest.fixture(scope="module")
def flood(tmp_path_factory: pytest.TempPathFactory) -> Flood:
    tmp = tmp_path_factory.mktemp("flood")
    (tmp / "rules.yaml").write_text(RULES)
    args = ("--config", str(tmp / "rules.yaml"), "--grpc", "off", "--max-keys", str(N),
            "--max-body", str(1024 * 1024))  # fmt: skip
    with serving(*args, tmp=tmp) as served:
        result = run_flood(served)
        served.terminate()
        result.log = served.stderr.read_text().splitlines()
    return result


def test_memory_stops_growing_at_the_bound(flood: Flood) -> None:
    # from 3 N keys on the store is full and its dicts have reached their size
    settled = flood.rss[3 * N // BATCH :]
    keys_after = FLOOD - 3 * N
    growth = max(settled) - settled[0]
    assert growth < keys_after * UNBOUNDED_BYTES_PER_KEY / 10, (
        f"RSS grew {growth / 2**20:.1f} MB over the last {keys_after:,} keys at the bound"
    )


def test_the_oldest_keys_are_forgotten(flood: Flood) -> None:
    # remembered, flood-0 would have 3 left (2 of 5 spent); forgotten, it starts afresh
    assert flood.first_key_remaining == LIMIT - 1


def test_a_recent_user_stays_exact(flood: Flood) -> None:
    assert flood.user_admitted == LIMIT


def test_recent_keys_of_another_rule_stay_exact(flood: Flood) -> None:
    assert flood.login_admitted == dict.fromkeys(LOGIN_IPS, LIMIT)


def test_the_server_logged_no_error(flood: Flood) -> None:
    errors = [line for line in flood.log if "Traceback" in line or '"level": "error"' in line]
    assert not errors, errors[:5]
