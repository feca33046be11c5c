"""What ``ratewarden serve`` says and does as it starts, with a real server: which
rules it serves (none unless asked, the file, or the shipped demo), the envoy
domains it loaded, a store that does not answer, HEAD where GET is served, and
a bare port for --http and --grpc."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import time
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import httpx
import pytest

from ratewarden.server._readiness import policies_said
from ratewarden.server._serve_options import demo_rules
from tests.redis_server import free_port, redis_server
from tests.server.conftest import ENVOY
from tests.server.process import RATEWARDEN, Served, serving

ROOT = Path(__file__).resolve().parents[2]


def banner(served: Served) -> str:
    """The line `serving` read: the first on stdout."""
    text = served.stderr.read_text()
    assert "Traceback" not in text, text
    return text


def first_line(*args: str, tmp: Path) -> str:
    """The banner of a service started with ``args``, which is stopped after."""
    port = free_port()
    command = [str(RATEWARDEN), "serve", "--http", f"127.0.0.1:{port}", "--grpc", "off", *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True)  # fmt: skip
    try:
        assert process.stdout is not None
        return process.stdout.readline()
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def wait_for(words: str, where: Path, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds  # waiting for the service, not for a clock edge
    while words not in where.read_text():
        assert time.monotonic() < deadline, f"{words!r} not logged:\n{where.read_text()}"
        time.sleep(0.05)


# -- which rules ----------------------------------------------------------------------------


def test_without_config_no_rules_are_served_and_the_banner_says_so(tmp_path: Path) -> None:
    line = first_line(tmp=tmp_path)
    assert "rules: none (give --config FILE, or --demo" in line, line
    assert "examples" not in line


def test_without_config_a_check_meets_no_rule(tmp_path: Path) -> None:
    with serving("--grpc", "off", tmp=tmp_path) as served:
        rules = httpx.get(f"{served.url}/v1/rules").json()
        assert rules["rules"] == []
        login = {"attributes": {"method": "POST", "path": "/api/login", "ip": "1.2.3.4"}}
        for _ in range(20):  # the demo's login rule allows 5 a minute
            answer = httpx.post(f"{served.url}/v1/check", json=login).json()
            assert answer["allowed"] is True
            assert answer["rule"] is None
        assert not [line for line in served.stderr.read_text().splitlines() if "ERROR" in line]


def test_demo_serves_the_shipped_example_rules(tmp_path: Path) -> None:
    with serving("--demo", "--grpc", "off", tmp=tmp_path) as served:
        rules = httpx.get(f"{served.url}/v1/rules").json()
        shipped = [r["name"] for r in rules["rules"]]
        assert "login-per-ip" in shipped
        assert len(shipped) == 14
        assert rules["source"] == demo_rules()
    line = first_line("--demo", tmp=tmp_path)
    assert "rules: the demo's, 14 rules on domain ratewarden (" in line, line


def test_the_demo_file_is_in_the_package_and_the_same_as_the_example() -> None:
    shipped = Path(demo_rules())
    assert ROOT / "src" in shipped.parents  # the package's, not the repository's examples/
    assert shipped.read_bytes() == (ROOT / "examples" / "rules.yaml").read_bytes()


def test_the_demo_file_is_package_data() -> None:
    """A wheel holds only the package data pyproject.toml names."""
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = settings["tool"]["setuptools"]["package-data"]["ratewarden"]
    assert any(fnmatch("server/demo/rules.yaml", pattern) for pattern in patterns), patterns


def test_the_rule_file_given_and_the_envoy_domains_are_in_the_banner(
    rules_file: Path, tmp_path: Path
) -> None:
    envoy = tmp_path / "envoy"
    envoy.mkdir()
    (envoy / "edge.yaml").write_text(ENVOY)
    (envoy / "billing.yaml").write_text(ENVOY.replace("domain: edge", "domain: billing"))
    line = first_line("--config", str(rules_file), "--envoy-config", str(envoy), tmp=tmp_path)
    said = f"rules: {rules_file}, 5 rules on domain ratewarden; envoy domains: billing, edge"
    assert said in line


def test_demo_and_config_together_are_refused(rules_file: Path) -> None:
    done = subprocess.run([str(RATEWARDEN), "serve", "--demo", "--config", str(rules_file)],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "ratewarden serve: --demo serves the example rules: give it or --config, not both"
    )


# -- a store that does not answer at start ----------------------------------------------------


def test_a_store_unreachable_at_start_is_logged_shown_and_its_return_logged(
    rules_file: Path, tmp_path: Path
) -> None:
    with redis_server() as redis:
        redis.stop()
        args = ("--config", str(rules_file), "--grpc", "off", "--store", redis.url,
                "--store-timeout", "0.5")  # fmt: skip
        with serving(*args, tmp=tmp_path) as served:
            log = served.stderr
            said = [json.loads(line) for line in log.read_text().splitlines()]
            start = [s for s in said if "does not answer at start" in s["message"]]
            assert len(start) == 1, said
            assert start[0]["level"] == "error"
            message = start[0]["message"]
            assert f"store {redis.url} does not answer at start" in message
            assert "the rules' on_failure: fail_open (5 limits)" in message
            ready = httpx.get(f"{served.url}/readyz")
            assert ready.status_code == 503
            body = ready.json()
            assert body["status"] == "store unreachable"
            assert "ConnectionError" in body["reason"]
            assert body["store"] == redis.url
            assert body["meanwhile"] == "the rules' on_failure: fail_open (5 limits)"

            redis.start()  # the same port
            wait_for(f"store {redis.url} answers again", log)
            assert httpx.get(f"{served.url}/readyz").status_code == 200

            redis.stop()
            wait_for(f"store {redis.url} stopped answering", log)


# -- HEAD ---------------------------------------------------------------------------------------


def head(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("HEAD", path)
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        connection.close()


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/healthz",
        "/readyz",
        "/metrics",
        "/v1/rules",
        "/openapi.json",
        "/dashboard/app.js",
    ],
)
def test_head_is_answered_where_get_is(rules_file: Path, tmp_path: Path, path: str) -> None:
    with serving("--config", str(rules_file), "--grpc", "off", tmp=tmp_path) as served:
        got = httpx.get(served.url + path)
        status, headers, body = head(served.http, path)
        assert (status, body) == (got.status_code, b"")
        assert headers["content-type"] == got.headers["content-type"]
        if path != "/metrics":  # its figures move between the two requests
            assert headers["content-length"] == str(len(got.content))


def test_head_of_the_dashboard_page_is_its_headers(rules_file: Path, tmp_path: Path) -> None:
    """``curl -I /``: the dashboard page is what / serves."""
    with serving("--config", str(rules_file), "--grpc", "off", tmp=tmp_path) as served:
        status, headers, body = head(served.http, "/")
        assert status == 200
        assert body == b""
        assert headers["content-type"] == "text/html; charset=utf-8"
        refused = httpx.delete(f"{served.url}/healthz")
        assert refused.status_code == 405
        assert refused.headers["allow"] == "GET, HEAD"
        status, headers, _ = head(served.http, "/v1/events")
        assert status == 200
        assert headers["content-type"].startswith("text/event-stream")


# -- a bare port -------------------------------------------------------------------------------


def test_a_bare_port_is_a_loopback_address(rules_file: Path, tmp_path: Path) -> None:
    http_port, grpc_port = free_port(), free_port()
    command = [str(RATEWARDEN), "serve", "--config", str(rules_file),
               "--http", str(http_port), "--grpc", str(grpc_port)]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert f"HTTP on http://127.0.0.1:{http_port}" in line, line
        assert f"gRPC on 127.0.0.1:{grpc_port}" in line, line
        assert httpx.get(f"http://127.0.0.1:{http_port}/healthz").status_code == 200
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


# the last: fullwidth digits, which str.isdigit() takes for a number
@pytest.mark.parametrize("junk", ["junk", "80a", "99999", "host:", ":http", "\uff18\uff10"])
@pytest.mark.parametrize("flag", ["--http", "--grpc"])
def test_junk_for_an_address_is_a_clear_error(flag: str, junk: str) -> None:
    done = subprocess.run([str(RATEWARDEN), "serve", flag, junk], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"ratewarden serve: {flag} takes HOST:PORT, a PORT (127.0.0.1:PORT) or 'off', got {junk!r}"
    )
    assert re.fullmatch(r"[^\n]+\n", done.stderr)


@pytest.mark.parametrize(
    ("on_failure", "envoy", "concurrency", "said"),
    [
        ([], False, 0, "no rules"),
        (["fail_open", "fail_open"], False, 0, "the rules' on_failure: fail_open (2 limits)"),
        ([], False, 1, "503 for the requests of 1 concurrency rule"),
        (
            ["raise"],
            True,
            2,
            "the rules' on_failure: raise (1 limit); 503 for the requests of 2 concurrency"
            " rules; envoy domains fail open",
        ),
    ],
)
def test_the_store_down_log_says_what_answers_meanwhile(
    on_failure: list[str], envoy: bool, concurrency: int, said: str
) -> None:
    """Concurrency rules have no failure policy: their requests are refused, which
    the log line says, rather than that no rules answer."""
    assert policies_said(on_failure, envoy, concurrency) == said
