"""Bad rule files: each a `RuleFileError` (a ConfigurationError) naming file, line,
rule and field, never a traceback from deeper down."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ratewarden import ConfigurationError
from ratewarden.rules import MAX_BYTES, Problem, RuleFileError, load, loads


def problem_of(text: str) -> Problem:
    with pytest.raises(RuleFileError) as info:
        loads(textwrap.dedent(text), "rules.yaml")
    assert isinstance(info.value, ConfigurationError)
    return info.value.problems[0]


def test_a_good_file_loads() -> None:
    ruleset = loads(
        textwrap.dedent("""
        defaults: {on_failure: fail_closed, algorithm: fixed_window}
        rules:
          - name: login
            description: brute force guard
            rate: 5/minute
            by: ip
            match: {paths: /api/login, methods: [POST]}
        """)
    )
    (rule,) = ruleset.rules
    assert (rule.name, rule.line) == ("login", 4)
    assert rule.limits[0].algorithm == "fixed_window"
    assert rule.limits[0].on_failure == "fail_closed"
    assert str(rule.limits[0].rate) == "5/minute"


@pytest.mark.parametrize(
    ("text", "line", "rule", "field", "words"),
    [
        (  # unknown field, pointed at the key itself
            """
            rules:
              - name: a
                rate: 1/second
                burts: 3
            """,
            5, "a", "burts", "unknown field",
        ),
        (  # wrong type
            """
            rules:
              - name: a
                rate: 1/second
                priority: high
            """,
            5, "a", "priority", "Expected `int`",
        ),
        (  # missing field
            """
            rules:
              - name: a
            """,
            3, "a", "rate", "no rate: give one like",
        ),
        (  # bad enum
            """
            rules:
              - name: a
                rate: 1/second
                action: block
            """,
            5, "a", "action", "Invalid enum value",
        ),
        (  # bad rate, in a list
            """
            rules:
              - name: a
                rate: [1/second, 10/fortnight]
            """,
            4, "a", "rate", "unknown unit 'fortnight'",
        ),
        (  # duplicate names
            """
            rules:
              - name: a
                rate: 1/second
              - name: a
                rate: 2/second
            """,
            5, "a", "name", "duplicate rule name (first at line 3)",
        ),
        (  # an option that does not go with the action
            """
            rules:
              - name: a
                rate: 1/second
                action: log_only
                max_wait: 2
            """,
            6, "a", "max_wait", "goes with action 'delay'",
        ),
        (  # delay without max_wait
            """
            rules:
              - name: a
                rate: 1/second
                action: delay
            """,
            3, "a", "max_wait", "needs 'max_wait'",
        ),
        (  # burst on a window algorithm
            """
            rules:
              - name: a
                rate: 1/second
                algorithm: fixed_window
                burst: 5
            """,
            6, "a", "burst", "burst applies to",
        ),
        (  # a bad path pattern
            """
            rules:
              - name: a
                rate: 1/second
                match:
                  paths: [/ok, "api/x"]
            """,
            6, "a", "match.paths", "starts with '/'",
        ),
        (  # a parameter that is not a whole segment
            """
            rules:
              - name: a
                rate: 1/second
                match: {paths: "/users/id{x}"}
            """,
            5, "a", "match.paths", "whole segment",
        ),
        (  # global and match together
            """
            rules:
              - name: a
                rate: 1/second
                global: true
                match: {methods: GET}
            """,
            5, "a", "global", "applies everywhere",
        ),
        (  # a status out of range
            """
            rules:
              - name: a
                rate: 1/second
                status: 200
            """,
            5, "a", "status", "4xx or 5xx",
        ),
        (  # a header without a name
            """
            rules:
              - name: a
                rate: 1/second
                by: ["header:"]
            """,
            5, "a", "by", "needs a header name",
        ),
        (  # a trusted proxy that is not a network
            """
            client_ip: {trusted_proxies: [10.0.0.0/8, not-an-ip]}
            rules:
              - name: a
                rate: 1/second
            """,
            2, None, "client_ip.trusted_proxies", "does not appear to be an IPv4 or IPv6",
        ),
        (  # a top-level key that does not exist
            """
            rule:
              - name: a
            """,
            2, None, "rule", "unknown field",
        ),
        (  # YAML syntax
            """
            rules:
              - name: a
                rate: [1/second
            """,
            5, None, None, "expected ',' or ']'",
        ),
        (  # duplicate keys, which PyYAML would silently collapse
            """
            rules:
              - name: a
                rate: 1/second
                rate: 100/second
            """,
            5, None, None, "duplicate key 'rate' (first at line 4)",
        ),
        (  # aliases: no billion laughs
            """
            x: &a [1, 2]
            rules: *a
            """,
            3, None, None, "aliases (*name) are not allowed",
        ),
        (  # several documents
            """
            rules: []
            ---
            rules: []
            """,
            3, None, None, "expected a single document",
        ),
        (  # no rules at all
            """
            rules: []
            """,
            2, None, "rules", "no rules",
        ),
        (  # a list where a mapping belongs
            """
            - name: a
            """,
            2, None, None, "must be a mapping with a 'rules:' list",
        ),
        (  # a python tag: SafeLoader refuses it
            """
            rules: !!python/object/apply:os.system [echo hi]
            """,
            2, None, None, "could not determine a constructor",
        ),
    ],
)  # fmt: skip
def test_bad_files_name_line_rule_and_field(
    text: str, line: int, rule: str | None, field: str | None, words: str
) -> None:
    problem = problem_of(text)
    assert problem.file == "rules.yaml"
    assert (problem.line, problem.rule, problem.field) == (line, rule, field), problem
    assert words in problem.reason
    assert str(problem).startswith(f"rules.yaml:{line}: ")


def test_every_meaning_problem_is_reported_at_once() -> None:
    with pytest.raises(RuleFileError) as info:
        loads("rules:\n  - {name: a, rate: 1/eon}\n  - {name: b, rate: 1/s, status: 99}\n")
    assert [(p.rule, p.field) for p in info.value.problems] == [("a", "rate"), ("b", "status")]
    assert str(info.value).startswith("2 problems:\n  <string>:2: rule 'a', field 'rate'")


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing but a comment\n")
    with pytest.raises(RuleFileError, match=r"empty\.yaml: the file is empty"):
        load(path)


def test_binary_junk(tmp_path: Path) -> None:
    path = tmp_path / "junk.yaml"
    path.write_bytes(b"rules:\n\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    with pytest.raises(RuleFileError, match=r"junk\.yaml:2: not UTF-8 text \(byte 0x89\)"):
        load(path)
    path.write_bytes(b"rules:\n  - \x00\x01")
    with pytest.raises(RuleFileError, match=r"junk\.yaml:2: contains a NUL byte"):
        load(path)


def test_a_50_mb_file_is_refused_by_its_size_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("wb") as f:  # sparse: 50 MB on paper, nothing on disk
        f.truncate(50 * 1024 * 1024)
    with pytest.raises(RuleFileError) as info:
        load(path)
    assert "52,428,800 bytes is more than a rule file may hold" in str(info.value)
    assert f"({MAX_BYTES:,} bytes)" in str(info.value)


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RuleFileError, match=r"nope\.yaml: cannot read: No such file"):
        load(tmp_path / "nope.yaml")


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    with pytest.raises(RuleFileError):
        loads("rules: " + "[" * 5000 + "]" * 5000)


def test_unreachable_rules_are_warned_about_not_refused() -> None:
    ruleset = loads(
        textwrap.dedent("""
        rules:
          - name: all-api
            group: api
            priority: 10
            rate: 100/minute
            by: user
            match: {paths: "/api/*"}
          - name: orders
            group: api
            rate: 10/minute
            by: [user, org]
            match: {paths: "/api/orders/{id}", methods: GET}
          - name: free-plan
            group: api
            rate: 5/minute
            by: ip
            match: {paths: "/api/*", attributes: {plan: free}}
        """),
        "rules.yaml",
    )
    (warning,) = ruleset.warnings
    assert (warning.line, warning.rule) == (9, "orders")
    assert "never applies: 'all-api' (line 3) ranks before it in group 'api'" in warning.reason


def test_a_billion_laughs_is_refused_at_its_first_alias() -> None:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        prev, name = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    lines.append("rules: *i")
    with pytest.raises(RuleFileError) as info:
        loads("\n".join(lines), "bomb.yaml")
    assert str(info.value).startswith("bomb.yaml:2: ")
    assert "aliases (*name) are not allowed" in str(info.value)


@pytest.mark.parametrize(
    "text",
    [
        "rules: " + "[" * 50_000 + "]" * 50_000 + "\n",
        "rules:\n  - name: a\n    rate: 1/minute\n    description: "
        + "{a: " * 30_000
        + "b"
        + "}" * 30_000
        + "\n",
    ],
)
def test_deep_nesting_is_refused_not_a_crash(text: str) -> None:
    """libyaml's composer recurses in C: unbounded nesting kills the process."""
    with pytest.raises(RuleFileError, match="nested more than 64 levels"):
        loads(text, "deep.yaml")
