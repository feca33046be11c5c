"""Hypothesis generators for rule files, in one place."""

from __future__ import annotations

from typing import TypeVar

from hypothesis import strategies as st

from ratewarden.rules import ClientIP, CostFrom, Defaults, Match, Response, Rule, RuleFile

names = st.from_regex(r"[a-z0-9][a-z0-9_.\-]{0,12}", fullmatch=True)
texts = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
values = st.one_of(st.sampled_from(["a", "b", "free"]), texts)  # some that requests carry
rates = st.sampled_from(["1/second", "100/minute", "5/2hours", "1000/day", "10 per second"])
paths = st.sampled_from(["/api/login", "/api/v1/orders*", "/users/{id}", "/a/*/b", "/f/x?[ab]"])
methods = st.sampled_from(["GET", "POST", "delete"])
who = st.sampled_from(["user", "api_key", "ip", "org", "header:x-tenant", "custom_attr"])
proxies = st.sampled_from(["10.0.0.0/8", "127.0.0.1", "::1", "fd00::/8"])
attribute_names = st.sampled_from(["plan", "org", "tier", "region"])
T = TypeVar("T")


def one_or_many(s: st.SearchStrategy[T]) -> st.SearchStrategy[T | list[T]]:
    return st.one_of(s, st.lists(s, min_size=1, max_size=3))


@st.composite
def matches(draw: st.DrawFn) -> Match:
    match = Match(
        paths=draw(st.one_of(st.just([]), one_or_many(paths))),
        methods=draw(st.one_of(st.just([]), one_or_many(methods))),
        attributes=draw(st.dictionaries(attribute_names, one_or_many(values), max_size=2)),
    )
    if not (match.paths or match.methods or match.attributes):
        return Match(methods="GET")
    return match


@st.composite
def rules(draw: st.DrawFn, name: str) -> Rule:
    action = draw(st.sampled_from(["reject", "log_only", "delay", "shadow_ban"]))
    algorithm = draw(st.sampled_from([None, "fixed_window", "gcra", "token_bucket"]))
    bucket = algorithm in ("gcra", "token_bucket")
    return Rule(
        name=name,
        rate=draw(st.one_of(rates, st.lists(rates, min_size=1, max_size=3, unique=True))),
        description=draw(texts),
        group=draw(st.one_of(st.none(), names)),
        priority=draw(st.integers(-1000, 1000)),
        by=draw(st.one_of(st.just([]), one_or_many(who))),
        match=draw(st.one_of(st.none(), matches())),
        algorithm=algorithm,
        burst=draw(st.one_of(st.none(), st.integers(1, 10**6))) if bucket else None,
        cost=draw(st.one_of(st.integers(1, 100), st.builds(CostFrom, attribute=attribute_names))),
        action=action,  # type: ignore[arg-type]
        status=draw(st.sampled_from([None, 429, 503])) if action == "reject" else None,
        max_wait=draw(st.floats(0.001, 60)) if action == "delay" else None,
        response=(
            draw(st.one_of(st.none(), st.builds(Response, status=st.just(200), body=texts)))
            if action == "shadow_ban"
            else None
        ),
        on_failure=draw(st.sampled_from([None, "fail_open", "fail_closed"])),
    )


@st.composite
def rule_files(draw: st.DrawFn) -> RuleFile:
    rule_names = draw(st.lists(names, min_size=1, max_size=6, unique=True))
    return RuleFile(
        rules=[draw(rules(name)) for name in rule_names],
        defaults=Defaults(
            algorithm=draw(st.sampled_from(["sliding_window_counter", "fixed_window"])),
            on_failure=draw(st.sampled_from(["fail_open", "fail_closed"])),
        ),
        client_ip=ClientIP(trusted_proxies=draw(st.lists(proxies, max_size=2))),
    )
