"""``ratewarden override``: its tables, its JSON and its exit codes, through a
service and straight in a Redis."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

from tests.redis_server import RedisServer, free_port
from tests.server.conftest import RULES
from tests.server.process import RATEWARDEN, serving


def ratewarden(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RATEWARDEN), "override", *args], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def test_through_a_service(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    token = tmp_path / "token"
    token.write_text("tok\n")
    with serving("--config", str(rules), "--token-file", str(token), tmp=tmp_path) as served:
        service = ["--url", served.url, "--token-file", str(token)]
        done = ratewarden("set", "search", "9/minute", "--for", "2h", "--reason", "load test",
                          "--by", "carol", *service)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("search: 9/minute (was 2/minute) for 2h00m")
        assert "this service process only" in done.stdout  # the memory store: say so
        listed = ratewarden("list", "--audit", "5", *service)
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
        assert lines[0].split() == ["RULE", "RATES", "REPLACES", "LEFT", "BY", "REASON"]
        assert lines[1].split()[:3] == ["search", "9/minute", "2/minute"]
        assert "carol (from 127.0.0.1)" in lines[1]
        assert lines[3].startswith("AT (UTC)")
        assert " set " in lines[4]
        as_json = json.loads(ratewarden("list", "--json", *service).stdout)
        assert [o["rule"] for o in as_json["overrides"]] == ["search"]
        assert as_json["audit"] == []  # none asked for
        # refused: one line on stderr and exit code 2
        for args, message in [
            (["set", "nope", "1/minute", "--for", "1m", "--reason", "r"], "no rule named"),
            (["set", "search", "1/minute", "--for", "1y", "--reason", "r"], "bad duration"),
        ]:
            done = ratewarden(*args, *service)
            assert done.returncode == 2
            assert message in done.stderr
            assert len(done.stderr.splitlines()) == 1
        done = ratewarden("set", "search", "1/minute", "--for", "1m", "--reason", "r",
                          "--url", served.url)  # fmt: skip
        assert done.returncode == 2
        assert "--token-file" in done.stderr  # no token: the hint
        done = ratewarden("clear", "search", "--reason", "done", *service)
        assert (done.returncode, done.stdout.split(":")[0]) == (0, "search")
        assert "no override in force" in ratewarden("clear", "search", *service).stdout


def test_straight_in_redis(tmp_path: Path, redis_single: RedisServer) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.replace("name: search", f"name: search-{uuid.uuid4().hex[:6]}"))
    name = next(w for w in rules.read_text().split() if w.startswith("search-"))
    where = ["--store", redis_single.url, "--rules", str(rules)]
    done = ratewarden("set", name, "9/minute", "--for", "60", "--reason", "r", "--json", *where)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["override"]["limits"] == ["9/minute"]
    listed = json.loads(ratewarden("list", "--json", *where).stdout)
    assert name in [o["rule"] for o in listed["overrides"]]
    assert json.loads(ratewarden("clear", name, "--json", *where).stdout)["removed"] is True


def test_usage_and_unreachable_exit_codes(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    for args, code, message in [
        (["list", "--store", "redis://127.0.0.1:1/0"], 2, "--store and --rules go together"),
        (["list", "--store", "mongodb://x", "--rules", str(rules)], 2, "Redis URL"),
        (["list", "--audit", "5000"], 2, "--audit takes 0..1000"),
        (["list", "--url", f"http://127.0.0.1:{free_port()}"], 3, "cannot reach the service"),
        (["list", "--store", f"redis://127.0.0.1:{free_port()}/0", "--rules", str(rules)], 3, ""),
        (["set", "search", "1/minute", "--reason", "r"], 2, "--for"),
    ]:
        done = ratewarden(*args)
        assert done.returncode == code, (args, done.stderr)
        assert message in done.stderr
        assert "Traceback" not in done.stderr
