"""The dashboard end to end in a real browser: Debian's chromium, driven by
Playwright, against ``ratewarden serve`` on a free loopback port.

Traffic trips a limit and the denial count rises on the page without a reload;
an override set from the page shows with its time left and takes effect (the
key it denied is admitted); a refused override shows the API's own error; a key
made of HTML stays text. The README's screenshot is taken of a demo run
(`serve --demo`, traffic a user would send it): it goes to the test's directory,
and to docs/dashboard.png when RATEWARDEN_SCREENSHOT=1 asks for it, so that a
test run leaves the files under git as they were.
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

from tests.server.process import Served, serving, serving_rules

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


def demo_check(served: Served, attributes: dict[str, str]) -> None:
    answer = httpx.post(f"{served.url}/v1/check", json={"attributes": attributes},
                        headers=AUTH, timeout=10)  # fmt: skip
    assert answer.status_code == 200, answer.text


def test_the_readme_screenshot_is_a_demo_run(browser: Browser, tmp_path: Path) -> None:
    """What a new user sees after `./dev run`: the demo's rules, and keys such as
    their own traffic makes; nothing a test leaves (no HTML keys, no temporary
    folder)."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    with serving("--demo", "--grpc", "off", "--token-file", str(token), tmp=tmp_path) as served:
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.goto(served.url + f"/#token={TOKEN}")
        expect(page.locator("#status")).to_contain_text("live")
        # traffic spread over a few seconds (not to any boundary), so the charts have a shape
        for second in range(6):
            for n in range(4 + 2 * second):
                demo_check(served, {"method": "GET", "path": "/api/v1/orders",
                                    "user": f"user-{n % 5}"})  # fmt: skip
                demo_check(served, {"method": "POST", "path": "/api/login",
                                    "ip": f"203.0.113.{n % 3}"})  # fmt: skip
            demo_check(served, {"method": "GET", "path": "/api/v1/orgs/acme/export",
                                "org": "acme"})  # fmt: skip
            time.sleep(1)
        expect(page.locator("#total-denied")).not_to_have_text("0")
        expect(page.locator("#rules-source")).to_contain_text("demo")
        text = page.inner_text("body")
        assert "<img" not in text
        assert str(tmp_path) not in text
        assert "pytest" not in text
        shot = tmp_path / "dashboard.png"
        page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("RATEWARDEN_SCREENSHOT") == "1":
        shutil.copyfile(shot, ROOT / "docs" / "dashboard.png")


# An operator's envoy config: descriptors nested three deep, values as long as
# the ones gateways send (IPv6 addresses, SPIFFE ids), on top of YAML rules of
# which one has a long name and several `by` attributes, and one sees no traffic.
WIDE_RULES = textwrap.dedent("""
    version: 1
    rules:
      - name: api
        rate: 5/hour
        algorithm: token_bucket
        by: user
        match: {paths: /api}
      - name: partner-exports-per-tenant-region-and-user
        rate: [20/hour, 200/day]
        algorithm: token_bucket
        by: [tenant, region, user]
        match: {paths: /exports}
      - name: once
        rate: 100/hour
        algorithm: token_bucket
        by: user
        match: {paths: /once}
      - name: idle
        rate: 3/hour
        by: ip
        match: {paths: /idle}
""")
EDGE = textwrap.dedent("""
    domain: edge
    descriptors:
      - key: generic_key
        value: partner-api
        descriptors:
          - key: remote_address
            rate_limit: {unit: hour, requests_per_unit: 1}
          - key: header_match
            value: tenant
            descriptors:
              - key: authorization_subject
                rate_limit: {unit: hour, requests_per_unit: 1}
""")
SUBJECT = "spiffe://cluster.local/ns/payments-settlement/sa/settlement-reconciliation-worker-"


def envoy_check(served: Served, *entries: tuple[str, str]) -> None:
    descriptor = {"entries": [{"key": k, "value": v} for k, v in entries]}
    body = {"domain": "edge", "descriptors": [descriptor]}
    answer = httpx.post(f"{served.url}/v1/check", json=body, headers=AUTH, timeout=10)
    assert answer.status_code == 200, answer.text


# Measured in the page: per table, cells whose text takes more than one line,
# whether the card scrolls sideways, and the columns that end past the viewport.
LAYOUT = """() => {
  const lines = (cell) => {  // the lines its text takes (a button's box is not a line)
    const tops = new Set();
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let text = walker.nextNode(); text; text = walker.nextNode()) {
      const range = document.createRange();
      range.selectNodeContents(text);
      for (const box of range.getClientRects()) tops.add(Math.round(box.top));
    }
    return tops.size;
  };
  const out = {};
  for (const id of ["rates", "top", "rules", "overrides"]) {
    const table = document.getElementById(id).closest("table");
    const card = table.closest(".card");
    const cells = [...table.querySelectorAll("th, td")];
    out[id] = {
      wrapped: cells.filter((c) => lines(c) > 1).map((c) => c.textContent),
      scrolls: card.scrollWidth > card.clientWidth || table.scrollWidth > card.clientWidth,
      outside: cells.filter((c) => {
        const box = c.getBoundingClientRect();
        return box.width === 0 || box.left < 0 || box.right > window.innerWidth;
      }).map((c) => c.textContent),
      clipped: [...table.querySelectorAll("td.clip")]
        .filter((c) => c.scrollWidth > c.clientWidth)
        .map((c) => [c.textContent, c.title]),
    };
  }
  return out;
}"""
# Painted pixels of each rule's sparkline.
SPARKS = """() => Object.fromEntries([...document.querySelectorAll("#rates tr")].map((tr) => {
  const canvas = tr.querySelector("canvas");
  const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  let painted = 0;
  for (let i = 3; i < data.length; i += 4) painted += data[i] > 0;
  return [tr.dataset.rule, painted];
}))"""


def test_long_envoy_keys_read_at_1400px(
    browser: Browser, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """At 1400x900, with envoy keys of 90 characters and more: every cell one
    line (the long ones cut, the whole text in the title), no card scrolling
    sideways, every column in the viewport, and a sparkline for every rule,
    including one with a single second of traffic and one with none."""
    edge = tmp_path / "envoy"
    edge.mkdir()
    (edge / "edge.yaml").write_text(EDGE)
    with serving_rules(WIDE_RULES, TOKEN, "--envoy-config", str(edge), tmp=tmp_path) as served:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        problems: list[str] = []
        page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
        page.goto(served.url + f"/#token={TOKEN}")
        expect(page.locator("#status")).to_contain_text("live")
        check(served, "solo", "/once")  # one second of traffic, never again
        for _ in range(3):  # three seconds of traffic
            for n in range(4):
                address = f"2001:db8:85a3:0000:0000:8a2e:0370:{7330 + n}"
                envoy_check(served, ("generic_key", "partner-api"), ("remote_address", address))
                envoy_check(served, ("generic_key", "partner-api"), ("header_match", "tenant"),
                            ("authorization_subject", f"{SUBJECT}{n}"))  # fmt: skip
                check(served, f"user-{n % 2}")
                body = {"attributes": {"path": "/exports", "tenant": "acme-corporation-emea",
                                       "region": "eu-west-1", "user": f"u{n}"}}  # fmt: skip
                httpx.post(f"{served.url}/v1/check", json=body, headers=AUTH, timeout=10)
            time.sleep(1)
        override = {
            "limits": ["1000/hour", "10000/day"],
            "for": "30m",
            "by": "oncall@example.com",
            "reason": "incident 42: the partner's nightly batch, re-run after the outage",
        }
        answer = httpx.put(f"{served.url}/v1/overrides/partner-exports-per-tenant-region-and-user",
                           json=override, headers=AUTH, timeout=10)  # fmt: skip
        assert answer.status_code == 200, answer.text
        expect(page.locator("#top tr")).to_have_count(10)
        expect(page.locator("#overrides tr")).to_have_count(1)
        rules = ["api", "edge.generic_key_partner-api.header_match_tenant.authorization_subject",
                 "edge.generic_key_partner-api.remote_address", "idle", "once",
                 "partner-exports-per-tenant-region-and-user"]  # fmt: skip
        expect(page.locator("#rates tr")).to_have_count(len(rules))
        time.sleep(1.5)  # a sample more: the page as an operator finds it
        shot = tmp_path / "dashboard-1400.png"
        page.screenshot(path=str(shot), full_page=True)
        layout = page.evaluate(LAYOUT)
        sparks = page.evaluate(SPARKS)
        page.close()
    request.node.user_properties.append(("screenshot", str(shot)))
    for table, measured in layout.items():
        assert measured["wrapped"] == [], (table, measured["wrapped"])
        assert not measured["scrolls"], table
        assert measured["outside"] == [], (table, measured["outside"])
    # the long keys are cut, and the whole of each is in its cell's title
    clipped = dict(layout["top"]["clipped"])
    keys = [t for t in clipped if t.startswith("edge|generic_key=partner-api|header_match")]
    assert len(keys) == 4, clipped
    assert all(clipped[k] == k and SUBJECT in k for k in keys)
    assert sorted(sparks) == rules
    assert all(painted > 0 for painted in sparks.values()), sparks
    assert problems == []
