"""The docs site in a real browser: built by mkdocs (tests/docs_site.py), served from
a loopback HTTP server on a free port, and read in Debian's chromium through
Playwright, with the dashboard tests' browser.

The reader gets the six sections as tabs, reaches the rules reference from its tab,
copies a code block with its button, and finds a page with the search; the browser
asks nothing of any host but the one serving the site. The screenshots of the home
page and of the rules reference go to the test's directory, and to docs/site-home.png
and docs/site-reference.png when RATEWARDEN_SCREENSHOT=1 asks for them: a test run
leaves the files under git as they were.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, ViewportSize, expect

from tests.docs_site import DOCS, SECTIONS, build_site
from tests.system.test_dashboard_browser import browser
from tests.test_docs import blocks_of

__all__ = ["browser"]

# wide enough for material to show the tabs
VIEWPORT: ViewportSize = {"width": 1280, "height": 900}
COPY = 'button[data-md-type="copy"]'  # the button material's script puts on a code block


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def site_url(tmp_path: Path) -> Iterator[str]:
    """The built site over HTTP on a free loopback port, as `mkdocs serve` would give it
    (the search's worker fetches its index, which a file:// page may not)."""
    site = tmp_path / "site"
    build_site(site)
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def png_size(path: Path) -> tuple[int, int]:
    """A PNG's width and height, from its header."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is no PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def screenshot(page: Page, tmp_path: Path, name: str) -> None:
    shot = tmp_path / name
    page.screenshot(path=str(shot))
    assert png_size(shot) == (VIEWPORT["width"], VIEWPORT["height"])
    assert shot.stat().st_size > 40_000, f"{name}: too small to show the site"
    if os.environ.get("RATEWARDEN_SCREENSHOT") == "1":
        shutil.copyfile(shot, DOCS / name)


def test_the_docs_site_in_chromium(site_url: str, browser: Browser, tmp_path: Path) -> None:
    context = browser.new_context(viewport=VIEWPORT)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=site_url)
    page = context.new_page()
    asked: list[str] = []
    problems: list[str] = []
    page.on("request", lambda request: asked.append(request.url))
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)

    # the home page: the header, the sections as tabs in order, a copy button per block
    page.goto(site_url + "/")
    expect(page.locator(".md-header__topic").first).to_have_text("ratewarden")
    expect(page.locator(".md-tabs__link")).to_have_text(list(SECTIONS))
    expect(page.locator(".md-tabs__item--active")).to_have_text("Start")
    expect(page.locator("h1")).to_contain_text("Getting started")
    expect(page.locator(COPY)).to_have_count(len(blocks_of(DOCS / "index.md")))
    screenshot(page, tmp_path, "site-home.png")

    # the rules reference, from its tab: highlighted code, coloured by the theme
    page.locator(".md-tabs__link", has_text="Reference").click()
    expect(page.locator("h1")).to_contain_text("Rules reference")
    assert page.url == site_url + "/rules/"
    expect(page.locator(".md-tabs__item--active")).to_have_text("Reference")
    blocks = blocks_of(DOCS / "rules.md")
    expect(page.locator(COPY)).to_have_count(len(blocks))
    first = page.locator(".highlight").first
    keyword, name = first.locator("span.kn").first, first.locator("span.n").first
    colour = "(element) => getComputedStyle(element).color"
    assert keyword.evaluate(colour) != name.evaluate(colour), "the code is not coloured"
    screenshot(page, tmp_path, "site-reference.png")

    # the copy button copies the block as the page's source has it
    first.locator(COPY).click()
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied.strip() == blocks[0].code.strip()

    # the search, on the index built into the site
    page.locator(".md-search__input").click()
    page.keyboard.type("GCRA")  # keys, as a reader types: the search reads each one
    expect(page.locator(".md-search-result__meta")).to_contain_text("matching documents")
    expect(page.locator(".md-search-result__item").first).to_contain_text("Algorithms")

    elsewhere = [url for url in asked if not url.startswith((site_url + "/", "data:", "blob:"))]
    assert elsewhere == [], "the site fetched from another host"
    assert len(asked) > 5
    assert problems == []
    context.close()
