"""The dashboard end to end in a real browser: Debian's chromium, driven by
Playwright, against ``ratewarden serve`` on a free loopback port.

Traffic trips a limit and the denial count rises on the page without a reload;
an override set from the page shows with its time left and takes effect (the
key it denied is admitted); a refused override shows the API's own error; a key
made of HTML stays text. The screenshot goes to the test's directory, and to
docs/dashboard.png (which the README shows) when RATEWARDEN_SCREENSHOT=1 asks
for it: a test run leaves the files under git as they were.
"""

from __future__ import annotations

import os
import shutil
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

from tests.server.process import Served, serving_rules

ROOT = Path(__file__).parent.parent.parent
CHROMIUM = Path("/usr/bin/chromium")
TOKEN = "browser-token-5e1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# token buckets: no window edge to cross while the test runs
RULES = textwrap.dedent("""
    version: 1
    rules:
      - name: api
        rate: 5/hour
        algorithm: token_bucket
        by: user
        match: {paths: /api}
      - name: search
        rate: 20/hour
        algorithm: token_bucket
        by: user
        match: {paths: /api/search}
      - name: exports-watch
        rate: 3/hour
        algorithm: token_bucket
        action: log_only
        by: user
        match: {paths: /exports}
""")
XSS = '<img src=x onerror="window.__pwned = 1">'


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with serving_rules(RULES, TOKEN, tmp=tmp_path) as served:
        yield served


@pytest.fixture
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (./dev test installs it)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield launched
        finally:
            launched.close()


def check(served: Served, user: str, path: str = "/api", cost: int = 1) -> bool:
    body = {"attributes": {"path": path, "user": user}, "cost": cost}
    answer = httpx.post(f"{served.url}/v1/check", json=body, headers=AUTH, timeout=10)
    assert answer.status_code == 200, answer.text
    allowed: bool = answer.json()["allowed"]
    return allowed


def test_the_dashboard_live_in_chromium(served: Served, browser: Browser, tmp_path: Path) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    sign_in(page, served)
    problems.clear()  # the browser logs the 401 of the wrong token it was given
    denials_rise_live(page, served)
    refused_override_shows_the_error(page)
    assert [p for p in problems if "422" not in p] == []
    problems.clear()  # the browser logs the refusal it was just told
    row = override_from_the_page(page, served)
    screenshot(page, served, tmp_path)
    # cleared from the page: gone from the list, in the audit trail, the rule's own limit back
    row.locator("button").click()
    expect(page.locator("#override-message")).to_have_text("Override on api cleared.")
    expect(page.locator("#overrides tr")).to_have_count(0)
    expect(page.locator("#audit")).to_contain_text("cleared api")
    assert not check(served, "u1")
    assert page.evaluate("window.__same_page") is True
    assert problems == []


def sign_in(page: Page, served: Served) -> None:
    # without a token: the page asks for one, and says when it is wrong
    page.goto(served.url + "/")
    expect(page.locator("#login")).to_be_visible()
    page.fill("#token", "not-the-token")
    page.click("#login-form button")
    expect(page.locator("#login-error")).to_have_text("The service refused this token.")
    # the token in the fragment, which the page takes out of the address
    page.goto(served.url + f"/#token={TOKEN}")
    expect(page.locator("#status")).to_contain_text("live")
    assert "token" not in page.url
    expect(page.locator("#rules tr")).to_have_count(3)
    expect(page.locator("#rules-source")).to_contain_text("rules.yaml")
    page.evaluate("window.__same_page = true")  # gone if anything reloads the page


def denials_rise_live(page: Page, served: Served) -> None:
    assert [check(served, "u1") for _ in range(8)] == [True] * 5 + [False] * 3
    # (expect polls from Python: the page's policy forbids the eval wait_for_function needs)
    expect(page.locator("#total-denied")).to_have_text("3")
    assert [check(served, "u1") for _ in range(4)] == [False] * 4
    expect(page.locator("#total-denied")).to_have_text("7")
    assert page.evaluate("window.__same_page") is True
    expect(page.locator("#rates tr[data-rule='api'] td").nth(4)).to_have_text("7")
    expect(page.locator("#top tr").first).to_contain_text("u1")
    # a key made of HTML is shown as text, never run
    assert not check(served, XSS, cost=6)
    expect(page.locator("#top")).to_contain_text(XSS)
    assert page.locator("#top img").count() == 0
    assert page.evaluate("window.__pwned") is None


def refused_override_shows_the_error(page: Page) -> None:
    page.select_option("#override-rule", "api")
    page.fill("#override-limits", "lots/minute")
    page.fill("#override-for", "10m")
    page.fill("#override-reason", "incident 42: partner batch")
    page.click("#override-set")
    expect(page.locator("#override-message")).to_contain_text("Refused:")
    refused = page.inner_text("#override-message")
    assert "lots/minute" in refused or "rate" in refused, refused


def override_from_the_page(page: Page, served: Served) -> Locator:
    """Set from the page: it shows, with its time left, and takes effect."""
    page.fill("#override-limits", "1000/minute")
    page.click("#override-set")
    expect(page.locator("#override-message")).to_have_text("Override set on api.")
    row = page.locator("#overrides tr[data-rule='api']")
    expect(row).to_contain_text("1000/minute")
    expect(row).to_contain_text("incident 42: partner batch")
    expect(row.locator("td").nth(4)).to_contain_text("m")  # "9m 58s": minutes left
    listed = httpx.get(f"{served.url}/v1/overrides", headers=AUTH, timeout=10).json()
    assert [o["rule"] for o in listed["overrides"]] == ["api"]
    assert 590 <= listed["overrides"][0]["expires_in"] <= 600
    assert check(served, "u1")  # denied a moment ago, admitted under the override
    return row


def screenshot(page: Page, served: Served, tmp_path: Path) -> None:
    # traffic spread over a few seconds (not to any boundary), so the charts have a shape
    for second in range(6):
        for n in range(6 + 3 * second):
            check(served, f"user-{n % 4}", "/api/search")
            check(served, f"export-{n % 2}", "/exports")
        check(served, "u1")
        time.sleep(1)
    expect(page.locator("#rates tr")).to_have_count(3)
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("RATEWARDEN_SCREENSHOT") == "1":
        shutil.copyfile(shot, ROOT / "docs" / "dashboard.png")
