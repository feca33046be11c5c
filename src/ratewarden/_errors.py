"""The one error tree of ratewarden.

    RatewardenError
    ├── ConfigurationError (also ValueError)   bad rate, algorithm, cost or option
    ├── RateLimitTimeout                       acquire() got no permit by its deadline
    ├── LeaseNotHeld (also LookupError)        a released hold's lease was not held
    └── StoreError                             a backend failed (wrapped with ``raise ... from``)
        └── StoreUnavailable                   ...and the limit's policy is to raise

Being over the limit is not an error: ``hit`` returns a denied ``Decision``.
"""

from __future__ import annotations

__all__ = [
    "ConfigurationError",
    "LeaseNotHeld",
    "RateLimitTimeout",
    "RatewardenError",
    "StoreError",
    "StoreUnavailable",
]


class RatewardenError(Exception):
    """Base of every error ratewarden raises on purpose."""


class ConfigurationError(RatewardenError, ValueError):
    """A rate, algorithm, cost or option is malformed; the message names the bad part."""


class RateLimitTimeout(RatewardenError):
    """``acquire`` could not get a permit within ``max_wait``.

    ``retry_after`` is the wait (seconds) the last attempt reported, ``inf`` when
    the cost can never be granted by the limit; a caller that never got its turn
    (earlier callers of the same key still waiting) has the ``max_wait`` it gave up after.
    """

    def __init__(self, message: str, *, key: str, retry_after: float) -> None:
        super().__init__(message)
        self.key = key
        self.retry_after = retry_after


class LeaseNotHeld(RatewardenError, LookupError):
    """A concurrency limit's hold was released, or renewed, while its lease was not
    held: released already, never taken, or ended (its holder missed the renewals)
    and its slot reclaimed. The message says which; ``key`` and ``lease_id`` name it."""

    def __init__(self, message: str, *, key: str, lease_id: str) -> None:
        super().__init__(message)
        self.key = key
        self.lease_id = lease_id


class StoreError(RatewardenError):
    """The store failed; the backend's own exception is the ``__cause__``."""


class StoreUnavailable(StoreError):
    """The store could not decide (down, timed out, or its circuit breaker is open)
    and the limit's ``on_failure`` policy is ``"raise"``."""
