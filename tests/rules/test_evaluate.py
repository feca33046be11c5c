"""Which limits apply to a request: matching, groups, keys, costs."""

from __future__ import annotations

import re
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratewarden.rules import RuleSet, loads
from ratewarden.rules._paths import PathIndex, normalize_path, parse_pattern

RULES = textwrap.dedent("""
    client_ip:
      trusted_proxies: [10.0.0.0/8]
    rules:
      - name: login
        rate: 5/minute
        by: ip
        match: {paths: /api/login, methods: POST}

      - name: orders-read
        group: endpoint
        rate: 100/minute
        by: user
        match: {paths: "/api/v1/orders*", methods: [GET, HEAD]}
      - name: order-by-id
        group: endpoint
        rate: 50/minute
        by: user
        match: {paths: "/api/v1/orders/{id}", methods: GET}

      - name: free-plan
        group: plan
        rate: 1000/day
        by: [org, user]
        match: {attributes: {plan: free}}
      - name: paid-plan
        group: plan
        rate: 100000/day
        by: org
        match: {attributes: {plan: [pro, enterprise]}}

      - name: per-user
        group: caller
        priority: 10
        rate: 20/second
        by: user
      - name: per-ip
        group: caller
        rate: 5/second
        by: ip

      - name: uploads
        rate: 10000000/hour
        by: api_key
        cost: {attribute: body_size}
        match: {paths: /upload}

      - name: tenants
        rate: 100/second
        by: "header:X-Tenant"
        match: {paths: "/t/*/reports"}

      - name: everything
        rate: 10000/second
        global: true
        action: log_only
""")


@pytest.fixture(scope="module")
def ruleset() -> RuleSet:
    return loads(RULES, "rules.yaml")


def applied(ruleset: RuleSet, **attributes: object) -> dict[str, tuple[str, int]]:
    return {a.rule.name: (a.key, a.cost) for a in ruleset.evaluate(attributes)}


def test_tiers_from_every_group_apply_together(ruleset: RuleSet) -> None:
    got = applied(ruleset, method="GET", path="/api/v1/orders", user="u1", org="acme",
                  plan="free", ip="1.2.3.4")  # fmt: skip
    assert got == {
        "orders-read": ("u1", 1),
        "free-plan": ("acme/u1", 1),
        "per-user": ("u1", 1),
        "everything": ("", 1),
    }


def test_the_more_specific_rule_of_a_group_wins(ruleset: RuleSet) -> None:
    got = applied(ruleset, method="GET", path="/api/v1/orders/17", user="u1")
    assert "order-by-id" in got
    assert "orders-read" not in got
    # HEAD is not a method of the specific rule: the broader one applies
    got = applied(ruleset, method="HEAD", path="/api/v1/orders/17", user="u1")
    assert "orders-read" in got
    assert "order-by-id" not in got


def test_methods_are_compared_upper_case(ruleset: RuleSet) -> None:
    assert "login" in applied(ruleset, method="post", path="/api/login", ip="1.2.3.4")
    assert "login" not in applied(ruleset, method="GET", path="/api/login", ip="1.2.3.4")


def test_the_plan_picks_the_rule(ruleset: RuleSet) -> None:
    assert "paid-plan" in applied(ruleset, plan="enterprise", org="acme", user="u")
    assert applied(ruleset, plan="pro", org="acme")["paid-plan"] == ("acme", 1)
    got = applied(ruleset, plan="trial", org="acme", user="u")
    assert "paid-plan" not in got
    assert "free-plan" not in got


def test_a_missing_by_attribute_hands_over_to_the_next_rule_of_the_group(
    ruleset: RuleSet,
) -> None:
    assert applied(ruleset, ip="1.2.3.4", user="u1")["per-user"] == ("u1", 1)
    got = applied(ruleset, ip="1.2.3.4")  # anonymous: per ip instead
    assert got["per-ip"] == ("1.2.3.4", 1)
    assert "per-user" not in got
    assert applied(ruleset, ip="1.2.3.4", user="")["per-ip"] == ("1.2.3.4", 1)
    # a free-plan request without a user has no (org, user) key: no plan limit
    assert "free-plan" not in applied(ruleset, plan="free", org="acme")


def test_cost_from_an_attribute(ruleset: RuleSet) -> None:
    assert applied(ruleset, path="/upload", api_key="k", body_size=4096)["uploads"] == ("k", 4096)
    assert applied(ruleset, path="/upload", api_key="k", body_size="512")["uploads"][1] == 512
    assert applied(ruleset, path="/upload", api_key="k", body_size=0)["uploads"][1] == 1
    assert applied(ruleset, path="/upload", api_key="k")["uploads"][1] == 1
    assert applied(ruleset, path="/upload", api_key="k", body_size="junk")["uploads"][1] == 1


def test_keys_from_headers_and_query_strings(ruleset: RuleSet) -> None:
    got = applied(ruleset, path="/t/acme/reports?year=2024", headers={"x-tenant": "acme"})
    assert got["tenants"] == ("acme", 1)
    assert "tenants" not in applied(ruleset, path="/t/acme/reports", headers={})
    assert "tenants" not in applied(ruleset, path="/t/acme/x/reports", headers={"x-tenant": "a"})


def test_keys_of_several_attributes_cannot_collide(ruleset: RuleSet) -> None:
    one = applied(ruleset, plan="free", org="a/b", user="c")["free-plan"][0]
    other = applied(ruleset, plan="free", org="a", user="b/c")["free-plan"][0]
    assert one != other


@pytest.mark.parametrize(
    ("peer", "forwarded", "client"),
    [
        ("1.2.3.4", "6.6.6.6", "1.2.3.4"),  # an untrusted peer's header is ignored
        ("10.0.0.1", "6.6.6.6, 5.5.5.5", "5.5.5.5"),  # right-most untrusted hop
        ("10.0.0.1", "5.5.5.5, 10.0.0.7", "5.5.5.5"),  # trusted hops skipped
        ("10.0.0.1", "10.0.0.9, 10.0.0.7", "10.0.0.9"),  # all ours: the first
        ("10.0.0.1", "", "10.0.0.1"),
        ("10.0.0.1", None, "10.0.0.1"),
        ("10.0.0.1", "5.5.5.5:1111", "5.5.5.5"),  # a proxy that adds the port
        ("10.0.0.1", "[2001:db8::1]:4711, 10.0.0.7:80", "2001:db8::1"),
        ("10.0.0.1", "2001:db8::2", "2001:db8::2"),  # bare IPv6: colons, no port
    ],
)
def test_client_ip_behind_trusted_proxies(
    ruleset: RuleSet, peer: str, forwarded: str | None, client: str
) -> None:
    headers = {} if forwarded is None else {"x-forwarded-for": forwarded}
    got = applied(ruleset, method="POST", path="/api/login", ip=peer, headers=headers)
    assert got["login"] == (client, 1)


def test_priority_beats_specificity_and_file_order_breaks_ties() -> None:
    ruleset = loads(
        textwrap.dedent("""
        rules:
          - {name: broad, group: g, priority: 5, rate: 1/s, match: {paths: "/a*"}}
          - {name: exact, group: g, rate: 1/s, match: {paths: /a/b}}
          - {name: exact-too, group: g, rate: 1/s, match: {paths: /a/b}}
        """)
    )
    assert [a.rule.name for a in ruleset.evaluate({"path": "/a/b"})] == ["broad"]
    assert [w.rule for w in ruleset.warnings] == ["exact", "exact-too"]


def test_explain_says_why(ruleset: RuleSet) -> None:
    verdicts = {
        e.rule.name: (e.verdict, e.reason)
        for e in ruleset.explain({"method": "GET", "path": "/api/v1/orders/3", "user": "u"})
    }
    assert verdicts["order-by-id"] == ("applies", "matches; first in group 'endpoint'")
    assert verdicts["orders-read"] == (
        "lost",
        "matches, but 'order-by-id' ranks first in group 'endpoint'",
    )
    assert verdicts["login"] == ("no match", "path '/api/v1/orders/3' is not /api/login")
    assert verdicts["per-ip"] == ("skipped", "no value for by: ip")
    assert verdicts["free-plan"] == ("no match", "plan is None, not free")
    assert verdicts["tenants"][0] == "no match"


def test_evaluation_agrees_with_explain_on_many_requests(ruleset: RuleSet) -> None:
    for path in ("/api/login", "/api/v1/orders", "/api/v1/orders/9", "/upload", "/t/x/reports"):
        for method in ("GET", "POST", "HEAD"):
            for plan in ("free", "pro", None):
                attributes = {"path": path, "method": method, "plan": plan, "user": "u",
                              "org": "o", "ip": "1.1.1.1", "api_key": "k"}  # fmt: skip
                fast = {a.rule.name for a in ruleset.evaluate(attributes)}
                slow = {e.rule.name for e in ruleset.explain(attributes) if e.verdict == "applies"}
                assert fast == slow, attributes


SEGMENTS = st.sampled_from(["a", "b", "ab", "orders", "x1", ""])
PATTERN_SEGMENTS = st.sampled_from(["a", "b", "ab", "orders", "{id}", "a*", "*", "?b", "[ab]"])


@st.composite
def patterns(draw: st.DrawFn) -> str:
    segments = draw(st.lists(PATTERN_SEGMENTS, min_size=1, max_size=4))
    text = "/" + "/".join(segments)
    if text.endswith(("*", "}")) or not draw(st.booleans()):
        return text
    return text + "*"


@given(
    st.lists(patterns(), min_size=1, max_size=12),
    st.lists(st.lists(SEGMENTS, min_size=1, max_size=5), min_size=1, max_size=10),
)
def test_the_path_index_matches_exactly_what_each_pattern_matches(
    texts: list[str], paths: list[list[str]]
) -> None:
    index: PathIndex[str] = PathIndex()
    parsed = [parse_pattern(t) for t in texts]
    for pattern in parsed:
        index.add(pattern, pattern.text)
    for segments in paths:
        path = "/" + "/".join(segments)
        expected = {p.text for p in parsed if re.fullmatch(p.regex, path[1:])}
        assert set(index.lookup(path)) == expected, path


@pytest.mark.parametrize(
    ("pattern", "matches", "misses"),
    [
        ("/api/login", ["/api/login"], ["/api/login/", "/api/logins", "/api"]),
        ("/api/v1/orders*", ["/api/v1/orders", "/api/v1/orders/7", "/api/v1/orders-x"],
         ["/api/v1/order", "/api/v2/orders"]),
        ("/api/*", ["/api/", "/api/x", "/api/x/y"], ["/api", "/apix"]),
        ("/users/{id}/posts", ["/users/7/posts"], ["/users//posts", "/users/7/8/posts"]),
        ("/api/*/health", ["/api/a/health", "/api//health"], ["/api/a/b/health"]),
        ("/f/file?.[ct]xt", ["/f/file1.txt", "/f/fileA.cxt"], ["/f/file12.txt", "/f/file1.py"]),
    ],
)  # fmt: skip
def test_path_patterns(pattern: str, matches: list[str], misses: list[str]) -> None:
    index: PathIndex[str] = PathIndex()
    index.add(parse_pattern(pattern), pattern)
    for path in matches:
        assert index.lookup(path) == [pattern], path
    for path in misses:
        assert index.lookup(path) == [], path


def test_odd_attribute_types_do_not_break_evaluation(ruleset: RuleSet) -> None:
    got = applied(ruleset, method=["GET"], path=b"/api/login", user=42, plan=["free"],
                  org={"a": 1}, ip=None, headers="not a mapping")  # fmt: skip
    assert got["per-user"] == ("42", 1)
    assert "login" not in got
    assert applied(ruleset, method="get", path="/api/v1/orders", user=7)["orders-read"] == ("7", 1)


@pytest.mark.parametrize(
    ("forwarded", "client"),
    [
        ('for=6.6.6.6, for="5.5.5.5:4711";proto=https', "5.5.5.5"),  # port dropped
        ('for="[2001:db8::7]:80", for=10.0.0.7', "2001:db8::7"),  # brackets dropped
        ("For=5.5.5.5;by=10.0.0.1", "5.5.5.5"),  # names are case-insensitive
        ("proto=https", "10.0.0.1"),  # no for=: as close as we get is the peer
    ],
)
def test_client_ip_from_the_forwarded_header(forwarded: str, client: str) -> None:
    ruleset = loads(
        textwrap.dedent("""
        client_ip: {trusted_proxies: [10.0.0.0/8], header: Forwarded}
        rules: [{name: login, rate: 5/minute, by: ip}]
        """)
    )
    got = applied(ruleset, ip="10.0.0.1", headers={"forwarded": forwarded})
    assert got["login"] == (client, 1)


@pytest.mark.parametrize(
    ("proxies", "forwarded", "client"),
    [
        ("[unix]", "5.5.5.5", "5.5.5.5"),  # a proxy on a unix socket
        ("[unix]", None, None),  # no header: no address, the rule does not apply
        ("[10.0.0.0/8]", "5.5.5.5", None),  # without "unix": a peer with no address
    ],
)
def test_client_ip_behind_a_proxy_on_a_unix_socket(
    proxies: str, forwarded: str | None, client: str | None
) -> None:
    ruleset = loads(
        textwrap.dedent(f"""
        client_ip: {{trusted_proxies: {proxies}}}
        rules: [{{name: login, rate: 5/minute, by: ip}}]
        """)
    )
    headers = {} if forwarded is None else {"x-forwarded-for": forwarded}
    got = applied(ruleset, ip=None, headers=headers)
    assert got.get("login") == (None if client is None else (client, 1))


@pytest.mark.parametrize(
    "path",
    [
        "/api/login",
        "/%61pi/login",
        "/api//login",
        "//api/login",
        "/api/./login",
        "/api/x/../login",
        "/../api/login",
        "/api/login?next=/",
        "/api/%6C%6Fgin",
    ],
)
def test_paths_match_as_the_server_routes_them(ruleset: RuleSet, path: str) -> None:
    """Spelling a path differently (escapes, doubled slashes, dot segments) must
    not dodge a rule: gateways forward the raw request URI."""
    request = {"method": "POST", "path": path, "ip": "203.0.113.7"}
    assert "login" in applied(ruleset, **request)
    assert any(e.verdict == "applies" and e.rule.name == "login" for e in ruleset.explain(request))


def test_normalize_path_keeps_what_routing_keeps() -> None:
    assert normalize_path("/api/v1/orders/") == "/api/v1/orders/"
    assert normalize_path("/a/b/..") == "/a/"
    assert normalize_path("/.well-known/x") == "/.well-known/x"
    assert normalize_path("/") == "/"
    assert normalize_path("") == "/"


def test_two_prefixes_on_one_node_count_a_request_once() -> None:
    rules = loads(
        "rules:\n"
        "  - {name: orders, rate: 10/minute, match: {paths: '/api/v1/orders*'}}\n"
        "  - {name: archive, rate: 10/minute, match: {paths: '/api/v1/orders-archive*'}}\n"
    )
    for path in ("/api/v1/orders", "/api/v1/orders/7", "/api/v1/ord"):
        names = [a.rule.name for a in rules.evaluate({"path": path})]
        assert names == (["orders"] if path != "/api/v1/ord" else []), path
    names = [a.rule.name for a in rules.evaluate({"path": "/api/v1/orders-archive/1"})]
    assert sorted(names) == ["archive", "orders"]


def test_explain_agrees_with_evaluate_on_odd_paths(ruleset: RuleSet) -> None:
    for path in ("/api/login%3Fx", "api/login", "/api/login?x=%2F"):
        request = {"method": "POST", "path": path, "ip": "203.0.113.7"}
        applies = {e.rule.name for e in ruleset.explain(request) if e.verdict == "applies"}
        assert applies == set(applied(ruleset, **request)), path


def test_boolean_attributes_match_as_yaml_spells_them() -> None:
    rules = loads("rules:\n  - {name: beta, rate: 1/minute, match: {attributes: {beta: 'true'}}}\n")
    assert [a.rule.name for a in rules.evaluate({"beta": True})] == ["beta"]
    assert rules.evaluate({"beta": False}) == []
