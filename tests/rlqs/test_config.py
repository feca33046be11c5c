"""The rule file's ``rlqs`` entries: what a mistake in one says, how a bucket id
matches, and the fleet resource each id becomes."""

from __future__ import annotations

import json

import pytest

from ratewarden.fleet.config import check_name
from ratewarden.rlqs import bucket_rules, resource_name
from ratewarden.rlqs.config import match
from ratewarden.rules import RuleFileError, loads


def test_each_mistake_in_an_entry_is_named_with_its_line() -> None:
    text = """
rlqs:
  - name: api
    domain: envoy
    rate: 200/second
    algorithm: fair_sahre
  - name: api
    domain: ""
    rate: 5/ms
    lease: 1
    bucket: {name: ""}
"""
    with pytest.raises(RuleFileError) as caught:
        loads(text)
    said = str(caught.value)
    assert "did you mean 'fair_share'" in said
    assert "'api' is used twice" in said
    assert "no domain" in said
    assert "unknown unit 'ms'" in said
    assert "at least 2 seconds" in said
    assert "non-empty text" in said


def test_a_file_of_rlqs_entries_alone_loads() -> None:
    ruleset = loads("rlqs:\n  - {name: a, domain: envoy, rate: 10/second}\n")
    [rule] = bucket_rules(ruleset.file.rlqs)
    assert rule.quota.lease == 12.0
    assert rule.ttl == 9
    assert rule.quota.algorithm == "fair_share"


def test_a_pattern_matches_its_entries_with_any_value_for_a_star_and_the_first_entry_decides() -> (
    None
):
    rules = bucket_rules(
        loads(
            """
rlqs:
  - {name: acme, domain: envoy, bucket: {name: api, tenant: acme}, rate: 10/second}
  - {name: tenants, domain: envoy, bucket: {name: api, tenant: "*"}, rate: 5/second}
  - {name: rest, domain: envoy, rate: 1/second}
"""
        ).file.rlqs
    )

    def which(domain: str, bucket: dict[str, str]) -> str | None:
        found = match(rules, domain, bucket)
        return None if found is None else found.name

    assert which("envoy", {"name": "api", "tenant": "acme", "extra": "x"}) == "acme"
    assert which("envoy", {"tenant": "globex", "name": "api"}) == "tenants"
    assert which("envoy", {"name": "api"}) == "rest"  # no tenant: the catch-all
    assert which("other", {"name": "api"}) is None


def test_a_bucket_id_is_a_resource_name_readable_where_it_can_be_and_distinct_always() -> None:
    plain = resource_name("envoy", (("name", "api"), ("tenant", "acme")))
    assert plain == "rlqs/envoy/name:api/tenant:acme"
    odd = resource_name("envoy", (("name", "api"), ("tenant", "a b{c}")))
    alike = resource_name("envoy", (("name", "api"), ("tenant", "a_b_c_")))
    long = resource_name("envoy", (("path", "x" * 500),))
    for name in (plain, odd, alike, long):
        assert check_name(name) == name
    assert odd != alike
    assert len(long) <= 200


def test_check_config_shows_the_entries(capsys: pytest.CaptureFixture[str]) -> None:
    from ratewarden.cli import main  # noqa: PLC0415

    assert main(["check-config", "examples/rlqs/rules.yaml"]) == 0
    out = capsys.readouterr().out
    assert "api-per-tenant  envoy   name=api,tenant=*  200/second  fair_share  12s    9s" in out
    assert "0 rules, 0 limits, 1 rlqs bucket entries" in out
    assert main(["check-config", "examples/rlqs/rules.yaml", "--json"]) == 0
    [entry] = json.loads(capsys.readouterr().out)["rlqs"]
    assert entry["bucket"] == {"name": "api", "tenant": "*"}
    assert entry["ttl"] == 9
