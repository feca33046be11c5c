from __future__ import annotations

import math

import msgspec

__all__ = ["Decision"]


class Decision(msgspec.Struct, frozen=True, gc=False):
    """What a limiter says about one request.

    ``allowed``      the request may proceed (and, for ``hit``, was counted);
    ``limit``        the limit's size: requests per window, or bucket capacity;
    ``remaining``    how many more cost-1 requests would pass right now;
    ``reset_after``  seconds until the limit is whole again (0 when it is);
    ``retry_after``  seconds until this same request would pass: 0 when allowed,
                     ``inf`` when its cost exceeds what the limit can ever grant;
    ``rule``         the name of the limit that decided, if it has one;
    ``degraded``     the store could not decide and the limit's failure policy did
                     (``fail_open`` or ``fail_closed``): the other fields are not counts.

    A Decision is truthy when allowed, so ``if limiter.hit(key): ...`` reads well.
    """

    allowed: bool
    limit: int
    remaining: int
    reset_after: float
    retry_after: float
    rule: str | None = None
    degraded: bool = False

    def __bool__(self) -> bool:
        return self.allowed

    @property
    def reason(self) -> str | None:
        """Why the request was denied, in words; ``None`` when it was allowed."""
        if self.allowed:
            return None
        if self.degraded:
            return "the store is unavailable and the limit fails closed"
        if math.isinf(self.retry_after):
            return f"cost exceeds what a limit of {self.limit} can ever grant"
        return f"over the limit of {self.limit}; retry in {self.retry_after:.6g}s"
