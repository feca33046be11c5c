"""``ratewarden check-config`` and ``ratewarden explain``, run through main()."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ratewarden.cli import main

EXAMPLE = str(Path(__file__).parent.parent.parent / "examples" / "rules.yaml")


def test_check_config_prints_the_compiled_rules(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", EXAMPLE]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split() == ["name", "group", "priority", "rank", "where", "by", "rate",
                                "algorithm", "cost", "action", "on_failure"]  # fmt: skip
    login = next(line for line in lines if line.startswith("login-per-ip"))
    assert "POST /api/login" in login
    assert "5/minute, 20/hour" in login
    assert "fail_closed" in login
    assert "@body_size" in out
    assert "delay <=5s" in out
    # the file's rates and a queue's length, not the engine's bucket and ceiling
    replay = next(line for line in lines if line.startswith("webhook-replay"))
    assert re.search(r" 10/second +leaky_bucket +1 +queue 50 <=4s ", replay), replay
    media = next(line for line in lines if line.startswith("media-quality"))
    assert re.search(r" 600/minute +sliding_window_counter +1 +degrade to 2x ", media), media
    assert lines[-1] == f"{EXAMPLE}: 14 rules, 15 limits, 0 warning(s)"
    assert err == ""


def test_check_config_names_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "rules:\n"
        "  - name: a\n"
        "    rate: 10/parsec\n"
        "  - name: b\n"
        "    rate: 1/second\n"
        "    action: delay\n"
    )
    assert main(["check-config", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"error: {path}:3: rule 'a', field 'rate': unknown unit 'parsec' in rate '10/parsec':"
        " use one of second, minute, hour, day, week, month, year",
        f"error: {path}:4: rule 'b', field 'max_wait': action 'delay' needs 'max_wait'"
        " (seconds to hold a request)",
        f"ratewarden check-config: {path}: not loaded (2 problem(s))",
    ]


@pytest.mark.parametrize(
    "content", [b"", b"\x7fELF\x02\x01\x01\x00\x00", b"rules: [1, 2", b"a: &x 1\nb: *x\n"]
)
def test_check_config_never_shows_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    path = tmp_path / "x.yaml"
    path.write_bytes(content)
    assert main(["check-config", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}")
    assert "Traceback" not in err


def test_strict_fails_on_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(
        "rules:\n"
        "  - {name: all, group: g, priority: 1, rate: 9/s}\n"
        "  - {name: some, group: g, rate: 1/s, match: {methods: GET}}\n"
    )
    assert main(["check-config", str(path)]) == 0
    assert main(["check-config", "--strict", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"warning: {path}:3: rule 'some': never applies: 'all' (line 2)" in err


def test_check_config_names_an_unknown_field_with_every_other_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "rules:\n"
        "  - name: a\n"
        "    rate: 10/parsec\n"
        "    match: {path: /api/login}\n"
        "  - name: b\n"
        "    rate: 1/second\n"
        "    action: logonly\n"
    )
    assert main(["check-config", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"error: {path}:3: rule 'a', field 'rate': unknown unit 'parsec' in rate '10/parsec':"
        " use one of second, minute, hour, day, week, month, year",
        f"error: {path}:4: rule 'a', field 'match.path': unknown field 'path':"
        " did you mean 'paths'?",
        f"error: {path}:7: rule 'b', field 'action': Invalid enum value 'logonly': expected one"
        " of reject, log_only, delay, shadow_ban, degrade, queue; did you mean 'log_only'?",
        f"ratewarden check-config: {path}: not loaded (3 problem(s))",
    ]


def test_strict_fails_on_an_attribute_nothing_gives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text("rules:\n  - name: per-user\n    rate: 100/minute\n    by: usr\n")
    assert main(["check-config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == f"{path}: 1 rules, 1 limits, 1 warning(s)"
    assert err == (
        f"warning: {path}:4: rule 'per-user', field 'by': no front end gives attribute 'usr',"
        " nor does the file declare it (without it the rule never applies): did you mean"
        " 'user'? If the application gives it, declare it: 'attributes: [usr]'\n"
    )
    assert main(["check-config", "--strict", "--json", str(path)]) == 1
    (warning,) = json.loads(capsys.readouterr().out)["warnings"]
    assert warning.startswith(f"{path}:4: rule 'per-user', field 'by': ")
    path.write_text("attributes: [usr]\n" + path.read_text())
    assert main(["check-config", "--strict", str(path)]) == 0
    assert capsys.readouterr().err == ""


def test_explain_shows_why(capsys: pytest.CaptureFixture[str]) -> None:
    code = main([
        "explain", EXAMPLE, "--attr", "method=POST", "--attr", "path=/api/login",
        "--attr", "ip=10.0.0.5", "--header", "X-Forwarded-For=198.51.100.4, 10.0.0.9",
    ])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    rows = {re.split(r"\s{2,}", line)[1]: line for line in out.splitlines()[2:-1]}
    assert rows["login-per-ip"].split()[0] == "applies"
    assert "'198.51.100.4'" in rows["login-per-ip"]
    assert "5/minute, 20/hour" in rows["login-per-ip"]
    assert rows["per-ip"].startswith("applies")  # no user: per ip instead
    assert rows["per-user"].startswith("skipped")
    assert "no value for by: user" in rows["per-user"]
    assert rows["order-writes"].startswith("no match")
    assert out.splitlines()[-1] == (
        "3 rule(s), 4 limit(s) apply: login-per-ip, per-ip, service-wide"
    )


def test_explain_reports_a_lost_rule(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", EXAMPLE, "--attr", "user=u", "--attr", "ip=1.2.3.4"]) == 0
    out = capsys.readouterr().out
    lost = next(line for line in out.splitlines() if line.startswith("lost"))
    assert "per-ip" in lost
    assert "'per-user' ranks first in group 'caller'" in lost


def test_explain_rejects_a_malformed_attribute(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", EXAMPLE, "--attr", "method"]) == 2  # a usage error
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "ratewarden explain: --attr takes name=value, got 'method'\n"


def test_explain_takes_attributes_as_words(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", EXAMPLE, "method=POST", "path=/api/login", "ip=10.0.0.5"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "3 rule(s), 4 limit(s) apply: login-per-ip, per-ip, service-wide"
    )


def test_check_config_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", EXAMPLE, "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    report = json.loads(out)
    assert (report["file"], report["format"], report["loaded"]) == (EXAMPLE, "rules", True)
    assert (len(report["rules"]), report["limits"], report["warnings"]) == (14, 15, [])
    login = next(rule for rule in report["rules"] if rule["name"] == "login-per-ip")
    assert login["rates"] == ["5/minute", "20/hour"]
    assert (login["where"], login["on_failure"], login["by"]) == (
        "POST /api/login",
        "fail_closed",
        ["ip"],
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - name: a\n    rate: 10/parsec\n")
    assert main(["check-config", str(bad), "--json"]) == 1
    out, err = capsys.readouterr()
    assert err == ""
    report = json.loads(out)
    assert report["loaded"] is False
    assert [e.split(": ")[0] for e in report["errors"]] == [f"{bad}:3"]
    envoy = tmp_path / "envoy.yaml"
    envoy.write_text(
        "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, "
        "requests_per_unit: 2}\n"
    )
    assert main(["check-config", str(envoy), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["format"] == "envoyproxy/ratelimit"
    assert report["domains"] == ["edge"]
    assert report["limits"] == [
        {"domain": "edge", "descriptor": "ip", "rate": "2/minute", "name": None, "flags": []}
    ]


def test_import_ratewarden_pulls_in_no_yaml() -> None:
    code = (
        "import sys, ratewarden, ratewarden.cli; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('yaml', 'watchfiles')"
        " or m.startswith('ratewarden.rules')]; "
        "sys.exit(str(bad) if bad else 0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_check_config_knows_an_envoy_ratelimit_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """envoyproxy/ratelimit's format is checked as that, not as a rule file with an
    unknown field `domain`; a directory of it (a ConfigMap) too."""
    path = tmp_path / "config.yaml"
    path.write_text(
        "domain: mongo_cps\n"
        "descriptors:\n"
        "  - key: database\n"
        "    value: users\n"
        "    rate_limit: {unit: second, requests_per_unit: 500}\n"
        "    descriptors:\n"
        "      - key: user\n"
        "        rate_limit: {unlimited: true}\n"
    )
    assert main(["check-config", str(path)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split() == ["domain", "descriptor", "rate", "name", "flags"]
    assert lines[1].split() == ["mongo_cps", "database=users", "500/second", "-", "-"]
    assert lines[2].split()[:4] == ["mongo_cps", "database=users", ">", "user"]
    assert "unlimited" in lines[2]
    assert "envoyproxy/ratelimit configuration" in lines[-1]
    assert err == ""
    (tmp_path / "bad.yaml").write_text(
        "domain: x\ndescriptors:\n"
        "  - key: k\n    rate_limit: {unit: parsec, requests_per_unit: 5}\n"
    )
    assert main(["check-config", str(tmp_path)]) == 1
    _, err = capsys.readouterr()
    assert "unit 'parsec'" in err
    assert "unknown field" not in err


def test_explain_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["explain", EXAMPLE, "method=POST", "path=/api/login", "ip=10.0.0.5", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["request"] == {"method": "POST", "path": "/api/login", "ip": "10.0.0.5"}
    assert report["applies"] == ["login-per-ip", "per-ip", "service-wide"]
    assert report["limits"] == 4
    verdicts = {r["rule"]: r for r in report["rules"]}
    assert verdicts["login-per-ip"]["limits"] == ["5/minute", "20/hour"]
    assert verdicts["login-per-ip"]["key"] == "10.0.0.5"
    assert verdicts["per-user"]["verdict"] == "skipped"
    assert verdicts["per-user"]["limits"] == []


@pytest.mark.parametrize("command", ["check-config", "explain", "check", "bench"])
def test_every_command_reports_a_bad_rule_file_the_same_way(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each problem on a line `error: FILE:LINE: ...`, then one line that names the
    command, as every other error of a command does."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - name: a\n    rate: 10/parsec\n")
    words = [] if command == "check-config" else ["path=/"]
    assert main([command, str(bad), *words]) in (1, 2)
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"error: {bad}:3: rule 'a', field 'rate': unknown unit 'parsec' in rate '10/parsec':"
        " use one of second, minute, hour, day, week, month, year",
        f"ratewarden {command}: {bad}: not loaded (1 problem(s))",
    ]
