"""`Tally`: the checks counted by rule, as the service's /metrics and
OpenTelemetry read them. ``outcome`` writes ``count`` out for speed: the two
must count alike."""

from __future__ import annotations

import textwrap

from hypothesis import given
from hypothesis import strategies as st

from ratewarden import FakeClock, MemoryStore
from ratewarden.rules import Outcome, RuleEngine, RuleSet, Tally, loads

RULES = loads(
    textwrap.dedent("""
    rules:
      - name: orders
        rate: 3/minute
        algorithm: fixed_window
        by: user
        match: {paths: /orders}
      - name: everyone
        rate: [5/minute, 8/hour]
        algorithm: fixed_window
        by: user
      - name: preview
        rate: 1/minute
        algorithm: fixed_window
        by: user
        action: log_only
        match: {paths: /preview}
""")
)


def counted_by_count(tally: Tally, outcome: Outcome, ruleset: RuleSet, denied: str | None,
                     shadow_denied: str | None) -> None:  # fmt: skip
    """The check counted through `Tally.count`, with what `outcome` found."""
    rules = list(dict.fromkeys(applicable.rule.name for applicable in outcome.limits))
    decision = outcome.decision
    closest = None
    if decision is not None and decision.rule is not None:
        rule = ruleset.by_limit_name.get(decision.rule)
        closest = None if rule is None else rule.name
    tally.count(rules, decision, denied, closest, shadow_denied)


@given(st.lists(st.tuples(st.sampled_from(["/orders", "/preview", "/other"]),
                          st.sampled_from(["u1", "u2"])), max_size=30))  # fmt: skip
def test_outcome_counts_as_count_does(requests: list[tuple[str, str]]) -> None:
    engine = RuleEngine(RULES, MemoryStore(clock=FakeClock()))
    written_out, through_count = Tally(), Tally()
    for path, user in requests:
        outcome = engine.check({"path": path, "user": user})
        denied, shadow_denied = written_out.outcome(outcome, engine.ruleset)
        counted_by_count(through_count, outcome, engine.ruleset, denied, shadow_denied)
    for name in ("checks", "over_limit", "near_limit", "shadow_over_limit"):
        assert getattr(written_out, name) == getattr(through_count, name), name
    assert written_out.store_errors == through_count.store_errors
    assert sum(written_out.checks.values()) >= len(requests)  # every request meets "everyone"
