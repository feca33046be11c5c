"""ratewarden's pytest plugin: fixtures for code that is rate limited.

pytest loads it through the ``pytest11`` entry point, before any conftest.py.
Loading installs the switch that stores built without a clock read time
through (`TestSwitch`); it
reads the system clock until a test asks for the ``ratewarden`` fixture, so a
test that uses none of this sees what it would without the plugin. ``-p
no:ratewarden`` leaves the plugin out.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..primitives import install_test_switch
from ._limits import RateLimits

__all__ = ["ratewarden", "ratewarden_off"]

OFF = "ratewarden_off"

# As pytest loads the plugin, before any conftest.py is imported: an application
# a conftest.py imports builds its stores on the switch too.
install_test_switch()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{OFF}: every ratewarden limit admits every request in this test"
    )


@pytest.fixture
def ratewarden() -> Iterator[RateLimits]:
    """A fake clock for every memory store (``ratewarden.advance(seconds)``),
    the stores empty before and after the test; ``ratewarden.off()`` a block
    without limits."""
    limits = RateLimits.start()
    try:
        yield limits
    finally:
        limits.stop()


@pytest.fixture
def ratewarden_off() -> Iterator[None]:
    """Every limit admits every request for the test, and counts none."""
    switch = install_test_switch()
    switch.off = True
    try:
        yield
    finally:
        switch.off = False


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker(OFF) is not None:
        install_test_switch().off = True


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    if item.get_closest_marker(OFF) is not None:
        install_test_switch().off = False
