"""The simulation's clocks and the coordinators its members talk to: the
coordinator's Python model, or the real ``fleet.lua`` in a Redis (see `_command`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from ..fleet.alloc import MILLI
from ..fleet.config import QuotaConfig
from ..fleet.coordinator import Coordinator, Reply, Report, keys, parse_refresh
from ..fleet.model import Model
from ..primitives import StoreUnavailable

__all__ = [
    "Backend",
    "BackendFactory",
    "ModelBackend",
    "RedisBackend",
    "TrueClock",
    "Unreachable",
]

# -- clocks ---------------------------------------------------------------------


class TrueClock:
    """The simulation's time: the provider's, and the coordinator's."""

    def __init__(self, now: int) -> None:
        self.now = now

    def time_ns(self) -> int:
        return self.now

    def sleep(self, seconds: float) -> None:
        raise RuntimeError("nothing sleeps in a simulation")

    async def asleep(self, seconds: float) -> None:
        raise RuntimeError("nothing sleeps in a simulation")


class _MemberClock(TrueClock):
    """A member's clock: the true time plus its skew."""

    def __init__(self, true: TrueClock, offset: int) -> None:
        super().__init__(0)
        self.true, self.offset = true, offset

    def time_ns(self) -> int:
        return self.true.now + self.offset


# -- the coordinator --------------------------------------------------------------


class Backend(Protocol):
    """The coordinator the members talk to, at the simulation's true time."""

    label: str

    def set(self, config: QuotaConfig) -> list[Any]:
        """Create or change the resource; the messages it published."""
        ...

    def refresh(self, member: str, report: Report) -> Reply | None:
        """The member's refresh; the coordinator's reply."""
        ...

    def messages(self, reply: Reply) -> list[Any]:
        """What the refresh that gave ``reply`` published."""
        ...

    def leave(self, member: str) -> None: ...

    def holds(self, member: str) -> bool:
        """Whether the coordinator still keeps the member's record (no side effect)."""
        ...

    def held(self) -> tuple[int, int]:
        """What the live members hold, summed, and the effective total (millipermits)."""
        ...

    def close(self) -> None: ...


class ModelBackend:
    """The coordinator's Python model (`Model`), called with the true time."""

    label = "model"

    def __init__(self, clock: TrueClock) -> None:
        self.clock = clock
        self.model = Model()
        self._seen = 0

    def _ms(self) -> int:
        return self.clock.now // 1_000_000

    def set(self, config: QuotaConfig) -> list[Any]:
        self.model.set(self._ms(), config.fields())
        published = self.model.published[self._seen :]
        self._seen = len(self.model.published)
        return list(published)

    def refresh(self, member: str, report: Report) -> Reply | None:
        return parse_refresh(self.model.refresh(self._ms(), member, report))

    def messages(self, reply: Reply) -> list[Any]:
        """What the last refresh published (a request to the others to refresh)."""
        published = self.model.published[self._seen :]
        self._seen = len(self.model.published)
        return list(published)

    def leave(self, member: str) -> None:
        self.model.leave(self._ms(), member)

    def holds(self, member: str) -> bool:
        return member in self.model.members

    def held(self) -> tuple[int, int]:
        raw = self.model.show(self._ms())
        return sum(int(m[4]) for m in raw[3:]), int(self.model.cfg.get("eff_m", "0"))

    def close(self) -> None:
        return None


class RedisBackend:
    """``fleet.lua`` in a real Redis through `Coordinator`, on the true clock; the
    change messages read from a real subscription to the resource's channel."""

    label = "redis"

    def __init__(self, client: Any, clock: TrueClock, name: str) -> None:
        self.client = client
        self.coordinator = Coordinator(client, name, clock=clock)
        self._keys = keys(name)
        self._nudged: str | None = None  # the last nudge's time, its message read
        self.pubsub = client.pubsub()
        self.pubsub.subscribe(self.coordinator.channel)
        self._next("subscribe")

    def _next(self, kind: str) -> Any:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            message = self.pubsub.get_message(timeout=0.5)
            if message is not None and message["type"] == kind:
                return message["data"]
        raise StoreUnavailable(f"redis: no {kind} on {self.coordinator.channel} within 5 s")

    def set(self, config: QuotaConfig) -> list[Any]:
        # the members may have created it (they start before their Redis)
        existed = bool(self.client.exists(self._keys[0]))
        self.coordinator.set(config)
        return [self._next("message")] if existed else []  # a change is always published

    def refresh(self, member: str, report: Report) -> Reply | None:
        return self.coordinator.report(member, report)

    def messages(self, reply: Reply) -> list[Any]:
        """What the last refresh published: it says so in the time of its nudge
        (one a millisecond at most, so another refresh in the same millisecond
        as the one that nudged published nothing)."""
        nudged = reply.fields.get("nudge_ms")
        if nudged != str(reply.now_ms) or nudged == self._nudged:
            return []
        self._nudged = nudged
        return [self._next("message")]

    def leave(self, member: str) -> None:
        self.coordinator.leave(member)

    def holds(self, member: str) -> bool:
        return bool(self.client.hexists(self._keys[1], member))

    def held(self) -> tuple[int, int]:
        status = self.coordinator.show()
        if status is None:
            return 0, 0
        held = sum(round(m.has * MILLI) for m in status.members)
        return held, round(status.effective_total * MILLI)

    def close(self) -> None:
        try:
            self.pubsub.close()
        finally:
            self.client.delete(*self._keys)


class Unreachable:
    """A coordinator that does not answer until ``until`` (ns of the true clock):
    its calls raise `StoreUnavailable`, as a Redis not yet started makes the
    real coordinator's raise; the one behind it afterwards."""

    def __init__(self, backend: Backend, clock: TrueClock, until: int) -> None:
        self.backend, self.clock, self.until = backend, clock, until
        self.label = backend.label

    def _reach(self) -> None:
        if self.clock.now < self.until:
            raise StoreUnavailable("redis: quota coordination failed: connection refused")

    def set(self, config: QuotaConfig) -> list[Any]:
        self._reach()
        return self.backend.set(config)

    def refresh(self, member: str, report: Report) -> Reply | None:
        self._reach()
        return self.backend.refresh(member, report)

    def messages(self, reply: Reply) -> list[Any]:
        return self.backend.messages(reply)

    def leave(self, member: str) -> None:
        self._reach()
        self.backend.leave(member)

    def holds(self, member: str) -> bool:
        return self.clock.now >= self.until and self.backend.holds(member)

    def held(self) -> tuple[int, int]:
        return self.backend.held() if self.clock.now >= self.until else (0, 0)

    def close(self) -> None:
        self.backend.close()


BackendFactory = Callable[[TrueClock], Backend]
