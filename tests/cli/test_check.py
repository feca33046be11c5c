"""``ratewarden check`` against a rule file (memory or Redis store) and a real
service, and ``ratewarden bench``, through main()."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ratewarden.algorithms import ALGORITHMS
from ratewarden.cli import main
from tests.redis_server import RedisServer
from tests.server.process import serving

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "rules.yaml")
LOGIN = ["method=POST", "path=/api/login", "ip=10.0.0.5"]
Capture = pytest.CaptureFixture[str]


def rows(out: str) -> list[list[str]]:
    """The table's rows, split into cells, without the header."""
    return [line.split() for line in out.splitlines()[1:] if line[:1].isdigit()]


def test_a_rule_file_decides_and_the_exit_code_says_so(capsys: Capture) -> None:
    assert main(["check", EXAMPLE, *LOGIN]) == 0
    # allowed, the rule whose limit the figures (and the headers) show
    assert rows(capsys.readouterr().out)[0][:5] == ["1", "yes", "allow", "200", "login-per-ip"]
    # login-per-ip: 5/minute; each run starts on a fresh memory store
    assert main(["check", EXAMPLE, *LOGIN, "--times", "6"]) == 1
    out = capsys.readouterr().out
    table = rows(out)
    assert [row[1] for row in table] == ["yes"] * 5 + ["no"]
    assert table[-1][2:5] == ["reject", "429", "login-per-ip"]
    assert "  Retry-After: " in out
    assert main(["check", EXAMPLE, *LOGIN, "--times", "5"]) == 0


def test_json_is_the_services_answer(capsys: Capture) -> None:
    assert main(["check", EXAMPLE, *LOGIN, "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert set(one) >= {"allowed", "action", "status", "rule", "limit", "remaining",
                        "reset_after", "retry_after", "wait", "degraded", "headers"}  # fmt: skip
    assert (one["allowed"], one["limit"], one["remaining"]) == (True, 5, 4)
    assert main(["check", EXAMPLE, *LOGIN, "--json", "--times", "6", "--cost", "1"]) == 1
    results = json.loads(capsys.readouterr().out)["results"]
    assert [r["allowed"] for r in results] == [True] * 5 + [False]


def test_cost_and_headers_reach_the_rules(capsys: Capture) -> None:
    # per-ip: 10/second; X-Forwarded-For from a trusted proxy names the client
    argv = ["check", EXAMPLE, "method=GET", "path=/api/orders", "ip=10.0.0.9",
            "--header", "X-Forwarded-For=198.51.100.4", "--json"]  # fmt: skip
    assert main([*argv, "--cost", "10"]) == 0
    assert json.loads(capsys.readouterr().out)["remaining"] == 0
    assert main([*argv, "--cost", "11"]) == 1
    assert json.loads(capsys.readouterr().out)["retry_after"] is None  # never


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", EXAMPLE, "path"], "an attribute takes NAME=VALUE, got 'path'"),
        (["check", EXAMPLE, "--url", "http://127.0.0.1:1", "a=b"], "give a rule file or --url"),
        (["check", "a=b", "--store", "memory"], "--store goes with a rule file"),
        (["check", EXAMPLE, "a=b", "--times", "1001"], "--times takes 1 to 1000, got 1001"),
        (["check", EXAMPLE, "a=b", "--cost", "0"], "--cost takes a whole number >= 1, got 0"),
        (["check", EXAMPLE, "a=b", "--store", "mongodb://x"], "--store takes 'memory' or a Redis"),
        (["bench", "a=b"], "NAME=VALUE attributes and --vary go with a rule file"),
        (["bench", "--seconds", "0"], "--seconds takes more than 0 and at most 3600, got 0"),
        (["bench", "--keys", "0"], "--keys takes a whole number >= 1, got 0"),
        (["bench", "--rate", "5/parsec"], "unknown unit 'parsec' in rate '5/parsec'"),
    ],
)
def test_bad_input_is_a_usage_error(argv: list[str], message: str, capsys: Capture) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"ratewarden {argv[0]}: {message}")


def test_a_rule_file_that_does_not_load(tmp_path: Path, capsys: Capture) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - name: a\n    rate: 10/parsec\n")
    for command in ("check", "bench"):
        assert main([command, str(bad), "a=b"]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert err.splitlines()[0].startswith(f"error: {bad}:3: rule 'a', field 'rate'")
        assert err.splitlines()[-1] == f"ratewarden {command}: {bad}: not loaded (1 problem(s))"


# the example's login rule with a sliding log: its fixed window's minute edge, which
# six runs on a busy machine straddled once, would reset the count between them
LOGIN_LOG = """\
rules:
  - name: login-per-ip
    rate: 5/minute
    algorithm: sliding_window_log
    by: ip
    match: {paths: /api/login, methods: POST}
"""


def test_a_redis_store_keeps_the_count(
    redis_single: RedisServer, capsys: Capture, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(LOGIN_LOG)
    ip = f"ip=10.9.{id(capsys) % 250}.{id(redis_single) % 250}"
    argv = ["check", str(rules), "method=POST", "path=/api/login", ip, "--store",
            redis_single.url]  # fmt: skip
    for _ in range(5):
        assert main(argv) == 0
    assert main(argv) == 1  # the sixth in a minute, counted in Redis across runs
    assert "login-per-ip" in rows(capsys.readouterr().out)[-1]


def test_check_asks_a_real_service(tmp_path: Path, capsys: Capture) -> None:
    token = tmp_path / "token"
    token.write_text("t0ken-for-the-test\n")
    with serving("--config", EXAMPLE, "--token-file", str(token), tmp=tmp_path) as served:
        argv = ["check", "--url", served.url, *LOGIN]
        assert main(argv) == 2  # no token
        assert "401 a valid bearer token is needed" in capsys.readouterr().err
        assert main([*argv, "--token-file", str(token)]) == 0
        assert rows(capsys.readouterr().out)[0][:2] == ["1", "yes"]
        assert main([*argv, "--token-file", str(token), "--times", "4", "--json"]) == 0
        results = json.loads(capsys.readouterr().out)["results"]
        assert [r["remaining"] for r in results] == [3, 2, 1, 0]
        assert main([*argv, "--token-file", str(token)]) == 1  # the service counted all six
        assert "login-per-ip" in rows(capsys.readouterr().out)[0]


def test_bench_measures_every_algorithm(capsys: Capture) -> None:
    assert main(["bench", "--seconds", "0.01", "--keys", "3", "--rate", "2/hour", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [run["run"] for run in report["runs"]] == list(ALGORITHMS)
    for run in report["runs"]:
        assert run["store"] == "memory"
        assert run["checks"] >= 64  # one batch at least
        assert run["checks_per_second"] > 0
        # 3 keys of 2 an hour: 6 checks pass, whatever the machine's speed
        assert run["allowed"] == round(6 / run["checks"], 4)


def test_bench_a_rule_file(redis_single: RedisServer, capsys: Capture) -> None:
    argv = ["bench", EXAMPLE, *LOGIN, "--seconds", "0.01", "--store", redis_single.url]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("one thread, one check at a time, the rule engine")
    assert out.splitlines()[2].split()[:2] == [EXAMPLE, redis_single.url]
    assert main([*argv, "--vary", "ip", "--keys", "7", "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    # login-per-ip: 5 a minute for each of 7 addresses
    assert run["allowed"] == round(35 / run["checks"], 4)


def test_times_shows_each_log_only_verdict(tmp_path: Path, capsys: Capture) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "version: 1\nrules:\n"
        "  - {name: watched, rate: 1/minute, action: log_only}\n"
        "  - {name: per-user, rate: 2/minute, by: user}\n"
    )
    assert main(["check", str(rules), "user=u1", "--times", "3"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-1] == "log_only"
    # the second passes though watched would deny it; the third, denied by per-user,
    # never reaches the log_only rule
    assert [line.split("  ")[-1].strip() for line in lines[1:4]] == [
        "would allow", "would deny: watched", "-",
    ]  # fmt: skip
    assert [row[1] for row in rows("\n".join(lines))] == ["yes", "yes", "no"]
    assert (
        lines[4]
        == "log_only: rule watched would have denied #2; it only logs, so the answers stand"
    )


def test_no_log_only_column_without_a_log_only_rule(tmp_path: Path, capsys: Capture) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("version: 1\nrules:\n  - {name: per-user, rate: 2/minute, by: user}\n")
    assert main(["check", str(rules), "user=u1", "--times", "3"]) == 1
    assert "log_only" not in capsys.readouterr().out
