"""The dashboard's page attacked in a real browser (Debian's chromium through
Playwright) against ``ratewarden serve``: a button pressed while the page
redraws, an address whose fragment is not a token, a token no header can carry.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.server.process import Served, serving_rules
from tests.system.test_dashboard_browser import AUTH, RULES, TOKEN, browser

__all__ = ["browser"]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with serving_rules(RULES, TOKEN, tmp=tmp_path) as served:
        yield served


def watched(browser: Browser) -> tuple[Page, list[str]]:
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    return page, problems


def test_a_button_pressed_across_a_redraw_still_clicks(served: Served, browser: Browser) -> None:
    """The page redraws every second; a press that spans a redraw is a click on
    the same button, not on one taken out of the page under the pointer."""
    body = {"limits": ["1000/minute"], "for": "10m", "reason": "load test", "by": "ops"}
    put = httpx.put(f"{served.url}/v1/overrides/api", json=body, headers=AUTH, timeout=10)
    assert put.status_code == 200, put.text
    page, problems = watched(browser)
    page.goto(served.url + f"/#token={TOKEN}")
    clear = page.locator("#overrides tr[data-rule='api'] button")
    expect(clear).to_be_visible()
    clear.hover()
    before = page.inner_text("#status")
    page.mouse.down()
    # the next snapshot redraws the page while the button is held
    expect(page.locator("#status")).not_to_have_text(before, timeout=5000)
    page.mouse.up()
    expect(page.locator("#override-message")).to_have_text("Override on api cleared.")
    listed = httpx.get(f"{served.url}/v1/overrides", headers=AUTH, timeout=10).json()
    assert listed["overrides"] == []
    assert problems == []


def test_a_fragment_that_is_not_a_token_asks_for_one(served: Served, browser: Browser) -> None:
    page, problems = watched(browser)
    page.goto(served.url + "/#token=%E0%A4%A")  # cut in the middle of a %-escape
    expect(page.locator("#login")).to_be_visible()
    expect(page.locator("#login-error")).to_contain_text("not a token")
    assert "token" not in page.url  # what was in the fragment is out of the address
    # the page still works: a token typed in connects
    page.fill("#token", TOKEN)
    page.click("#login-form button")
    expect(page.locator("#status")).to_contain_text("live")
    assert problems == []


def test_a_token_no_header_can_carry_is_refused_at_once(served: Served, browser: Browser) -> None:
    """A fetch cannot send it: that is the token's fault, said as such, not a
    service that cannot be reached and is retried every few seconds."""
    page, problems = watched(browser)
    page.goto(served.url + "/")
    expect(page.locator("#login")).to_be_visible()
    page.fill("#token", "ключ")
    page.click("#login-form button")
    expect(page.locator("#login-error")).to_contain_text("cannot be sent")
    expect(page.locator("#status")).not_to_contain_text("retrying")
    assert problems == []
