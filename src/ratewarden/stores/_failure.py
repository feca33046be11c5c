"""What a limit does when its store cannot decide: the policy and a circuit breaker.

Logic only, no I/O: the stores call these around their own I/O.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

from .._decision import Decision
from .._errors import ConfigurationError, StoreError

__all__ = ["POLICIES", "Breaker", "OnFailure", "check_policy", "fallback"]

OnFailure = Literal["raise", "fail_open", "fail_closed", "local_fallback"]
POLICIES = ("raise", "fail_open", "fail_closed", "local_fallback")


def check_policy(policy: object) -> None:
    if policy not in POLICIES:
        raise ConfigurationError(f"on_failure must be one of {', '.join(POLICIES)}, got {policy!r}")


def fallback(
    policy: OnFailure, size: int, rule: str | None, retry_after: float, error: StoreError
) -> Decision:
    """The policy's answer when the store failed with ``error`` (raised again as it is
    under ``"raise"``, its cause kept). ``"local_fallback"`` here, where no
    local count is kept (the memory store's own limits), allows, as fail_open."""
    if policy in ("fail_open", "local_fallback"):
        return Decision(True, size, size, 0.0, 0.0, rule, True)
    if policy == "fail_closed":
        return Decision(False, size, 0, retry_after, retry_after, rule, True)
    raise error


class Breaker:
    """Stops paying the store's timeout on every call while it is down.

    Closed while calls succeed. After ``threshold`` failures in a row it opens for
    ``cooldown`` seconds: calls fail at once. Then one caller at a time probes the
    store; a success closes it, a failure opens it again. Racy by design (a second
    probe may slip through); it only ever trades a little latency, never a decision.
    """

    def __init__(
        self,
        *,
        threshold: int = 2,
        cooldown: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold = threshold
        self.cooldown = cooldown
        self.clock = clock
        self.failures = 0  # in a row; the hot path reads only this
        self.open_until = 0.0
        self.probing = False
        self.probe_until = 0.0

    def allow(self) -> bool:
        """May this call go to the store? Only asked while ``failures`` is non-zero."""
        if self.failures < self.threshold:
            return True
        now = self.clock()
        # A probe that never reported (its caller was cancelled) stops counting as
        # one after a cooldown: the breaker must not stay open for good.
        if now < self.open_until or (self.probing and now < self.probe_until):
            return False
        self.probing = True
        self.probe_until = now + self.cooldown
        return True

    def succeeded(self) -> None:
        self.failures = 0
        self.probing = False

    def failed(self) -> None:
        self.failures += 1
        self.probing = False
        if self.failures >= self.threshold:
            self.open_until = self.clock() + self.cooldown

    def retry_after(self) -> float:
        """Seconds until the next probe may go out."""
        return max(self.open_until - self.clock(), 0.0) if self.failures else 0.0

    def __repr__(self) -> str:
        state = "closed" if self.failures < self.threshold else "open"
        return f"<Breaker {state}, {self.failures} failures in a row>"
