"""The rule engine on examples/rules.yaml, on simulated time (runs in milliseconds).

A signed-in user reads orders, an anonymous client guesses passwords, a script
signs up too often, and an export waits for its turn instead of failing.
"""

from __future__ import annotations

from pathlib import Path

from ratewarden import FakeClock, MemoryStore
from ratewarden.rules import RuleEngine

clock = FakeClock(1_700_000_000)  # the start of a minute: windows do not split the demo
engine = RuleEngine(Path(__file__).with_name("rules.yaml"), MemoryStore(clock=clock))
print(f"{len(engine.ruleset)} rules in force")

proxy = {"x-forwarded-for": "198.51.100.7"}
reader = {"method": "GET", "path": "/api/v1/orders/42", "user": "alice", "org": "acme",
          "plan": "pro", "ip": "10.0.0.4", "headers": proxy}  # fmt: skip
outcome = engine.check(reader)
print("alice reads an order:", outcome.status, [a.rule.name for a in outcome.limits])

guesser = {"method": "POST", "path": "/api/login", "ip": "10.0.0.4",
           "headers": {"x-forwarded-for": "203.0.113.9"}}  # fmt: skip
statuses = [engine.check(guesser).status for _ in range(7)]
print("203.0.113.9 tries 7 passwords:", statuses)
assert statuses == [200] * 5 + [429] * 2

signup = {"method": "POST", "path": "/api/signup", "ip": "192.0.2.50"}
answers = [engine.check(signup) for _ in range(4)]
print("a script signs up 4 times:", [(o.action, o.status) for o in answers])
assert answers[-1].action == "shadow_ban"
assert answers[-1].response is not None
assert answers[-1].response.body == '{"status": "pending"}'

export = {"method": "GET", "path": "/api/v1/orgs/acme/export", "org": "acme", "ip": "192.0.2.9"}
engine.check(export)
held = engine.check(export)
print(f"a second export at once: {held.action}, wait {held.wait:.2f}s")
start = clock.time_ns()
waited = engine.check(export, wait=True)
print(f"...waited {(clock.time_ns() - start) / 1e9:.2f}s (simulated), then {waited.status}")
assert waited.allowed
