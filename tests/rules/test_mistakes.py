"""The mistakes people make in rule files, caught and explained: every problem of
a file in one report, the closest name for a misspelt field or value, and a
warning for an attribute that nothing gives a rule to read."""

from __future__ import annotations

import textwrap

import pytest

from ratewarden.integrations._request import attributes
from ratewarden.rules import Problem, RuleFileError, dump, loads
from ratewarden.rules._schema import FRONT_END_ATTRIBUTES
from ratewarden.server._checker import ENVOY_ALIASES
from ratewarden.server._http_input import _AUTH_HEADERS


def problems_of(text: str) -> list[Problem]:
    with pytest.raises(RuleFileError) as info:
        loads(textwrap.dedent(text), "rules.yaml")
    return list(info.value.problems)


def where(problems: list[Problem]) -> list[tuple[int | None, str | None, str | None]]:
    return [(p.line, p.rule, p.field) for p in problems]


def test_an_unknown_field_hides_nothing_else() -> None:
    problems = problems_of("""
        version: 1
        defaults: {on_failure: fail_opne}
        rules:
          - name: login
            rate: 5/minute
            burts: 3
            match: {path: /api/login}
          - name: orders
            rate: 10/fortnight
            priority: high
          - name: search
            rate: 1/second
            status: 200
          - name: no-rate
            by: user
        """)
    assert where(problems) == [
        (3, None, "defaults.on_failure"),
        (7, "login", "burts"),
        (8, "login", "match.path"),
        (10, "orders", "rate"),
        (11, "orders", "priority"),
        (14, "search", "status"),
        (15, "no-rate", "rate"),
    ]
    reasons = [p.reason for p in problems]
    assert "unknown unit 'fortnight'" in reasons[3]
    assert reasons[4].startswith("Expected `int`, got `str`")
    assert "4xx or 5xx" in reasons[5]
    assert reasons[6].startswith("no rate: give one like '100/minute'")
    assert all(str(p).startswith(f"rules.yaml:{p.line}: ") for p in problems)


@pytest.mark.parametrize(
    ("text", "line", "rule", "field", "reason"),
    [
        (
            """
            rules:
              - name: a
                rate: 1/second
                match: {path: /api/login}
            """,
            5, "a", "match.path", "unknown field 'path': did you mean 'paths'?",
        ),
        (
            """
            rules:
              - name: a
                rate: 1/second
                algorithm: gcra
                burts: 3
            """,
            6, "a", "burts", "unknown field 'burts': did you mean 'burst'?",
        ),
        (  # the key's line, not its value's
            """
            rules:
              - name: a
                rate: 1/second
                mtach:
                  paths: /x
            """,
            5, "a", "mtach", "unknown field 'mtach': did you mean 'match'?",
        ),
        (  # nothing close: the fields there are listed
            """
            rules:
              - name: a
                rate: 1/second
                match: {xyzzy: 1}
            """,
            5, "a", "match.xyzzy",
            "unknown field 'xyzzy' (the fields here: paths, methods, attributes)",
        ),
        (  # a key YAML reads as a boolean
            """
            rules:
              - name: a
                rate: 1/second
                on: true
            """,
            5, "a", "True", "unknown field True",
        ),
    ],
)  # fmt: skip
def test_an_unknown_field_names_the_closest_known_one(
    text: str, line: int, rule: str, field: str, reason: str
) -> None:
    (problem,) = problems_of(text)
    assert (problem.line, problem.rule, problem.field) == (line, rule, field)
    assert problem.reason.startswith(reason), problem.reason


def test_a_misspelt_required_field_is_said_once() -> None:
    (problem,) = problems_of("""
        rule:
          - name: a
            rate: 1/second
        """)
    assert (problem.line, problem.field) == (2, "rule")
    assert problem.reason == "unknown field 'rule': did you mean 'rules'?"
    (problem,) = problems_of("""
        rules:
          - name: a
            rat: 1/second
        """)
    assert (problem.line, problem.rule, problem.field) == (4, "a", "rat")


@pytest.mark.parametrize(
    ("value", "field", "choices", "closest"),
    [
        ("action: logonly", "action", "reject, log_only, delay, shadow_ban, degrade, queue",
         "log_only"),
        ("on_failure: failopen", "on_failure", "fail_open, fail_closed, local_fallback",
         "fail_open"),
        ("store: two-tier", "store", "exact, two_tier", "two_tier"),
        ("refill: intervals", "refill", "continuous, interval", "interval"),
        ("action: block", "action", "reject, log_only, delay, shadow_ban, degrade, queue", None),
    ],
)  # fmt: skip
def test_a_bad_enum_value_lists_the_valid_ones_and_the_closest(
    value: str, field: str, choices: str, closest: str | None
) -> None:
    (problem,) = problems_of(f"rules:\n  - name: a\n    rate: 1/second\n    {value}\n")
    assert (problem.line, problem.rule, problem.field) == (4, "a", field)
    bad = value.partition(": ")[2]
    expected = f"Invalid enum value {bad!r}: expected one of {choices}"
    if closest is not None:
        expected += f"; did you mean {closest!r}?"
    assert problem.reason == expected


def test_a_misspelt_action_does_not_make_its_options_look_out_of_place() -> None:
    """What the file meant for a field it got wrong is unknown: the options of the
    action it meant are not judged against the default one."""
    problems = problems_of("""
        rules:
          - name: a
            rate: 1/second
            action: dealy
            max_wait: 2
          - name: b
            rate: 1/second
            actoin: delay
            max_wait: 2
          - name: c
            rate: 1/second
            match: {path: /x}
        """)
    assert where(problems) == [(5, "a", "action"), (9, "b", "actoin"), (13, "c", "match.path")]
    assert "did you mean 'delay'?" in problems[0].reason


def test_a_rule_that_is_not_a_mapping_is_one_problem_among_others() -> None:
    problems = problems_of("""
        rules:
          - per-ip
          - name: b
            rate: 1/parsec
        """)
    assert where(problems) == [(3, "#1", None), (5, "b", "rate")]
    assert problems[0].reason == "Expected `object`, got `str`"


def test_undeclared_attributes_are_warnings_that_name_the_closest() -> None:
    ruleset = loads(
        textwrap.dedent("""
        rules:
          - name: per-user
            rate: 100/minute
            by: usr
          - name: free
            rate: 10/minute
            by: [org, header:x-tenant]
            match:
              attributes: {pln: free}
          - name: uploads
            rate: 1000/minute
            cost: {attribute: body_sise}
          - name: tenants
            rate: 10/minute
            by: tenant
        """),
        "rules.yaml",
    )
    assert where(list(ruleset.warnings)) == [
        (5, "per-user", "by"),
        (10, "free", "match.attributes"),
        (13, "uploads", "cost"),
        (16, "tenants", "by"),
    ]
    usr, pln, body, tenant = (w.reason for w in ruleset.warnings)
    assert usr == (
        "no front end gives attribute 'usr', nor does the file declare it (without it the"
        " rule never applies): did you mean 'user'? If the application gives it, declare"
        " it: 'attributes: [usr]'"
    )
    assert "(without it the rule never matches): did you mean 'plan'?" in pln
    assert "did you mean 'body_size'?" in body
    assert "did you mean" not in tenant
    assert tenant.endswith("(without it the rule never applies): if the application gives it,"
                           " declare it: 'attributes: [tenant]'")  # fmt: skip


def test_declared_attributes_are_read_without_a_warning() -> None:
    text = textwrap.dedent("""
        attributes: [tenant, region]
        rules:
          - name: tenants
            rate: 10/minute
            by: [tenant, user]
            match: {attributes: {region: eu}}
          - name: slow
            rate: 1/second
            action: delay
            max_wait: 1
            priority_from: {attribute: tier, order: [gold]}
        """)
    ruleset = loads(text, "rules.yaml")
    ((line, rule, field),) = where(list(ruleset.warnings))
    assert (line, rule, field) == (12, "slow", "priority_from")
    assert "waits in the last class" in ruleset.warnings[0].reason
    assert ruleset.file.attributes == ["tenant", "region"]
    assert loads(dump(ruleset.file)).file == ruleset.file


def test_the_declaration_is_checked() -> None:
    problems = problems_of("""
        attributes: [tenant, "header:x", tenant]
        rules:
          - {name: a, rate: 1/second}
        """)
    assert where(problems) == [(2, None, "attributes"), (2, None, "attributes")]
    assert problems[0].reason.startswith("bad attribute name 'header:x'")
    assert problems[1].reason == "'tenant' is declared twice"


def test_the_front_ends_give_what_the_rules_take_as_known() -> None:
    """The known attributes are those of the framework integrations, of the
    service's /auth headers and of its envoy gRPC API: a name added to any of
    them belongs to the rules' set too."""
    given = set(attributes("GET", "/", "10.0.0.1", {}, body_size=1, route="/{x}"))
    given |= set(_AUTH_HEADERS.values()) | set(ENVOY_ALIASES.values()) | {"domain"}
    given |= {"user", "api_key", "org", "plan"}  # what `identify` gives, as the docs name it
    assert given == FRONT_END_ATTRIBUTES
