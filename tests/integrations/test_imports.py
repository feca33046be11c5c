"""Each integration pulls in its own framework and no other; the core none."""

from __future__ import annotations

import subprocess
import sys

import pytest

FRAMEWORKS = ("starlette", "fastapi", "flask", "werkzeug", "django", "httpx", "aiohttp", "uvicorn")


def imported_frameworks(*modules: str) -> set[str]:
    code = (
        f"import sys; import {', '.join(modules)}; "
        f"print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}} & set({FRAMEWORKS!r}))))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return set(out.stdout.split())


def test_import_ratewarden_pulls_in_no_framework() -> None:
    assert imported_frameworks("ratewarden", "ratewarden.integrations") == set()


@pytest.mark.parametrize(
    ("module", "allowed"),
    [
        ("asgi", set()),
        ("wsgi", set()),
        ("fastapi", {"fastapi", "starlette"}),
        ("flask", {"flask", "werkzeug"}),
        ("django", {"django"}),
        ("httpx", {"httpx"}),
        ("aiohttp", {"aiohttp"}),
    ],
)
def test_each_integration_imports_only_its_framework(module: str, allowed: set[str]) -> None:
    assert imported_frameworks(f"ratewarden.integrations.{module}") <= allowed


# A bare `pip install ratewarden` has no PyYAML: this finder makes it so in a
# subprocess of the dev venv, which has everything installed.
NO_YAML = """
import sys
class NoYaml:
    def find_spec(self, name, path=None, target=None):
        if name == "yaml" or name.startswith("yaml."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NoYaml())
"""

PLAIN_LIMITS = """
import asyncio
from ratewarden import AsyncLimiter, Limiter
from ratewarden.integrations import asgi, wsgi

async def app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})

async def asgi_answers():
    middleware = asgi.RateLimitMiddleware(app, AsyncLimiter("2/minute", name="per-ip"))
    answers = []
    for _ in range(3):
        sent = []
        async def send(message):
            sent.append(message)
        scope = {"type": "http", "method": "GET", "path": "/", "headers": [],
                 "client": ("10.0.0.1", 5000)}
        await middleware(scope, None, send)
        answers.append((sent[0]["status"], dict(sent[0]["headers"])))
    return answers

answers = asgi_answers()
answers = asyncio.run(answers)
assert [status for status, _ in answers] == [200, 200, 429], answers
assert answers[1][1][b"ratelimit-policy"] == b'"per-ip";q=2;w=60', answers
assert answers[2][1][b"retry-after"], answers

statuses = []
middleware = wsgi.RateLimitMiddleware(lambda e, s: s("200 OK", []) or [b"ok"], Limiter("1/minute"))
for address in ("10.0.0.1", "10.0.0.1", "10.0.0.2"):
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "REMOTE_ADDR": address}
    middleware(environ, lambda status, headers, exc_info=None: statuses.append(status))
assert statuses == ["200 OK", "429 Too Many Requests", "200 OK"], statuses

from ratewarden import ConfigurationError
try:
    asgi.RateLimitMiddleware(app, "rules.yaml")
except ConfigurationError as exc:
    assert "pip install 'ratewarden[rules]'" in str(exc), exc
else:
    raise AssertionError("a rule file's name is not an engine")
assert "yaml" not in sys.modules and "ratewarden.rules" not in sys.modules
print("ok")
"""


def test_the_asgi_and_wsgi_middleware_limit_without_pyyaml() -> None:
    """The README's core install promises the middleware: with a plain limiter it
    runs without the rule engine and its PyYAML (scripts/check_wheels.py checks
    the same on the built wheel in a clean venv)."""
    done = subprocess.run(
        [sys.executable, "-c", NO_YAML + PLAIN_LIMITS], check=False, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok"]


def test_the_finder_does_block_pyyaml() -> None:
    code = NO_YAML + "import ratewarden.rules"
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert "No module named 'yaml'" in done.stderr
