"""Testing code that is rate limited, without sleeping and without 429s left over
from the test before.

ratewarden's pytest plugin (``ratewarden.testing.plugin``) is loaded by pytest
through the package's ``pytest11`` entry point. Its fixtures and marker:

- ``ratewarden``: a `RateLimits` for the test. Every memory store, and so every
  limiter, rule engine and middleware on one, reads time from a `FakeClock`
  that only moves when the test says (``ratewarden.advance(60)``) or when code
  sleeps on it; the stores start the test empty and are emptied after it.
- ``ratewarden_off`` (a fixture) or ``@pytest.mark.ratewarden_off``: every
  limit admits every request for the test, and counts none.

Stores built at import time, before any test ran, follow both, since a store
given no clock reads time through the plugin's switch (`TestSwitch`). Redis
stores keep Redis's own time: fake time covers the memory store.
"""

from ._limits import RateLimits, install

__all__ = ["RateLimits", "install"]
