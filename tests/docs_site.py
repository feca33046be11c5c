"""The docs site as the tests read it: built by mkdocs from mkdocs.yml with warnings as
errors, and the parts of its pages that the tests hold to what mkdocs.yml asks for."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"

# The nav's sections, by the reader's task, in the order of the tabs across the top.
SECTIONS = (
    "Start",
    "Protect your API",
    "Obey a provider",
    "Run the service",
    "Operate",
    "Reference",
)

TAB = re.compile(r'<a href="[^"]*" class="md-tabs__link">(.*?)</a>', re.S)
CODE = re.compile(r'<div class="(?:language-([\w-]+) )?highlight">(.*?)</code></pre></div>', re.S)
TOKEN = re.compile(r'<span class="([\w-]+)">')
CONFIG = re.compile(r'<script id="__config" type="application/json">(.*?)</script>', re.S)


def build_site(site: Path) -> None:
    """``mkdocs build --strict`` into ``site``; a warning fails with mkdocs' messages."""
    # material prints a notice of its end of life on every build; without it a failure
    # shows only what mkdocs says about the pages
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr


def built_page(site: Path, page: Path) -> Path:
    """The HTML file that mkdocs makes of ``docs/NAME.md``."""
    return site / "index.html" if page.stem == "index" else site / page.stem / "index.html"


def tabs(html: str) -> list[str]:
    """The tabs across the top of a built page, by their text."""
    return [re.sub(r"<[^>]+>", "", found).strip() for found in TAB.findall(html)]


@dataclass(frozen=True)
class Shown:
    """A code block as the site shows it: its language and Pygments' token classes."""

    language: str
    tokens: frozenset[str]


def code_blocks(html: str) -> list[Shown]:
    """The highlighted code blocks a built page shows, in order (a fence inside an HTML
    comment is rendered too, and stays in the comment, unseen)."""
    shown = re.sub(r"<!--.*?-->", "", html, flags=re.S)
    return [Shown(lang or "", frozenset(TOKEN.findall(body))) for lang, body in CODE.findall(shown)]


def features(html: str) -> list[str]:
    """The theme features a built page's scripts are configured with."""
    found = CONFIG.search(html)
    assert found is not None, "no material configuration in the page"
    listed: list[str] = json.loads(found[1])["features"]
    return listed
