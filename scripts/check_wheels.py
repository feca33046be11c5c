"""Install the built wheel as a user would, one clean venv per extra, and use what
the README says each extra gives.

    .venv/bin/python scripts/check_wheels.py              # every extra, about a minute
    .venv/bin/python scripts/check_wheels.py core flask   # some of them

The dev venv has every dependency installed, so an import that needs a package the
extra does not bring passes there and fails for a user; here each venv holds the
wheel and that extra's dependencies only. The wheel is built once; uv makes the
venvs and installs into them from its cache, the versions held to requirements/dev.txt.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "dev.txt"
BIN = Path(sys.executable).parent

# A plain limit under the ASGI and WSGI middleware, with no PyYAML anywhere.
CORE = """
import asyncio, importlib.util
assert importlib.util.find_spec("yaml") is None, "the core must not bring PyYAML"
from ratewarden import AsyncLimiter, Limiter, MemoryStore
from ratewarden.integrations import asgi, wsgi

limiter = Limiter("2/minute", store=MemoryStore())
assert [limiter.hit("k").allowed for _ in range(3)] == [True, True, False]

async def app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})

async def asgi_statuses():
    middleware = asgi.RateLimitMiddleware(app, AsyncLimiter("2/minute"))
    statuses = []
    for _ in range(3):
        sent = []
        async def send(message):
            sent.append(message)
        async def receive():
            return {"type": "http.request", "body": b""}
        scope = {"type": "http", "method": "GET", "path": "/", "headers": [],
                 "client": ("10.0.0.1", 5000)}
        await middleware(scope, receive, send)
        statuses.append(sent[0]["status"])
    return statuses

assert asyncio.run(asgi_statuses()) == [200, 200, 429]

def wsgi_app(environ, start_response):
    start_response("200 OK", [])
    return [b"ok"]

middleware = wsgi.RateLimitMiddleware(wsgi_app, Limiter("1/minute"))
statuses = []
for _ in range(2):
    middleware({"REQUEST_METHOD": "GET", "PATH_INFO": "/", "REMOTE_ADDR": "10.0.0.1"},
               lambda status, headers, exc_info=None: statuses.append(status))
assert statuses == ["200 OK", "429 Too Many Requests"], statuses

# the testing helpers need no pytest (the plugin module alone imports it)
from ratewarden.testing import RateLimits
assert importlib.util.find_spec("pytest") is None, "the core must not bring pytest"
limits = RateLimits.start()
limiter = Limiter("1/minute", algorithm="fixed_window")
assert [limiter.hit("k").allowed, limiter.hit("k").allowed] == [True, False]
limits.advance(60)
assert limiter.hit("k").allowed
limits.stop()

# every command that needs an extra says which, in one line, exit 4
import subprocess, sys
from pathlib import Path
cli = Path(sys.executable).parent / "ratewarden"
Path("rules.yaml").write_text("rules: [{name: per-ip, rate: 1/minute, by: ip}]\\n")
for words, extra in (
    (["check-config", "rules.yaml"], "rules"),
    (["explain", "rules.yaml", "ip=10.0.0.1"], "rules"),
    (["check", "rules.yaml", "ip=10.0.0.1"], "rules"),
    (["serve", "--demo", "--http", "127.0.0.1:0"], "server"),
    (["simulate", "--seconds", "1"], "fleet"),
    (["quota", "list"], "fleet"),
):
    done = subprocess.run([cli, *words], capture_output=True, text=True)
    assert done.returncode == 4, (words, done.returncode, done.stderr)
    assert f"pip install 'ratewarden[{extra}]'" in done.stderr, (words, done.stderr)
    assert "Traceback" not in done.stderr, (words, done.stderr)
    assert len(done.stderr.splitlines()) == 1, (words, done.stderr)
for command, extra in (("serve", "server"), ("simulate", "fleet")):
    shown = subprocess.run([cli, command, "--help"], capture_output=True, text=True).stdout
    assert f"pip install 'ratewarden[{extra}]'" in " ".join(shown.split()), shown
"""

RULES = """
from ratewarden import MemoryStore
from ratewarden.rules import RuleEngine, loads
engine = RuleEngine(loads("rules: [{name: per-ip, rate: 1/minute, by: ip}]"), MemoryStore())
found = [engine.check({"method": "GET", "path": "/", "ip": "10.0.0.1"}).allowed for _ in range(2)]
assert found == [True, False], found
"""

REDIS = """
import hiredis
from ratewarden.stores.redis import AsyncRedisStore, RedisStore
"""

# The service answers HTTP on its own server: the extra brings no uvicorn.
SERVER = """
import importlib.util, socket, subprocess, sys, urllib.request
from pathlib import Path
import ratewarden.server
assert importlib.util.find_spec("uvicorn") is None, "the server extra installs uvicorn"
ratewarden_cli = Path(sys.executable).parent / "ratewarden"
done = subprocess.run([ratewarden_cli, "serve", "--help"], capture_output=True, text=True)
assert done.returncode == 0 and "--http" in done.stdout, done.stderr
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
serving = subprocess.Popen([ratewarden_cli, "serve", "--demo", "--http", f"127.0.0.1:{port}",
                            "--grpc", "off"], stdout=subprocess.PIPE, text=True)
try:
    assert "HTTP on" in serving.stdout.readline()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as answer:
        assert answer.status == 200 and answer.read() == b'{"status":"ok"}'
finally:
    serving.terminate()
    assert serving.wait(30) == 0
"""

# `pip install 'ratewarden[server]'` without grpc: HTTP served, gRPC off and said
# so on the start line; --grpc asked for names the extra.
SERVER_ONLY = """
import socket, subprocess, sys
from pathlib import Path
cli = Path(sys.executable).parent / "ratewarden"
serving = subprocess.Popen([cli, "serve", "--demo", "--http", "127.0.0.1:0"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
try:
    line = serving.stdout.readline()
    assert "HTTP on" in line and "pip install 'ratewarden[grpc]'" in line, line
finally:
    serving.terminate()
    _, err = serving.communicate(timeout=30)
assert serving.returncode == 0 and "Traceback" not in err, err
done = subprocess.run([cli, "serve", "--demo", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"],
                      capture_output=True, text=True, timeout=30)
assert done.returncode == 4 and "pip install 'ratewarden[grpc]'" in done.stderr, done.stderr
assert "Traceback" not in done.stderr, done.stderr
"""

FASTAPI = """
import asyncio
from fastapi import Depends, FastAPI
from ratewarden import AsyncMemoryStore
from ratewarden.integrations.asgi import RateLimitMiddleware
from ratewarden.integrations.fastapi import RateLimit
from ratewarden.rules import AsyncRuleEngine, loads

engine = AsyncRuleEngine(loads("rules: [{name: per-ip, rate: 1/minute, by: ip}]"),
                         AsyncMemoryStore())
app = FastAPI()

@app.get("/", dependencies=[Depends(RateLimit(engine))])
async def root() -> dict[str, str]:
    return {"ok": "yes"}

async def statuses():
    found = []
    for _ in range(2):
        sent = []
        async def send(message):
            sent.append(message)
        async def receive():
            return {"type": "http.request", "body": b""}
        scope = {"type": "http", "method": "GET", "path": "/", "headers": [],
                 "client": ("10.0.0.1", 5000), "query_string": b"", "http_version": "1.1",
                 "scheme": "http", "server": ("test", 80), "root_path": ""}
        await app(scope, receive, send)
        found.append(sent[0]["status"])
    return found

assert asyncio.run(statuses()) == [200, 429]
"""

FLASK = """
from flask import Flask
from ratewarden import MemoryStore
from ratewarden.integrations.flask import RateLimiter
from ratewarden.rules import RuleEngine, loads

app = Flask(__name__)
app.get("/")(lambda: "ok")
RateLimiter(app, RuleEngine(loads("rules: [{name: per-ip, rate: 1/minute, by: ip}]"),
                            MemoryStore()))
client = app.test_client()
assert [client.get("/").status_code for _ in range(2)] == [200, 429]
"""

DJANGO = """
from django.conf import settings
settings.configure(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["*"], MIDDLEWARE=[])
import django
django.setup()
from django.http import HttpResponse
from django.test import RequestFactory
from ratewarden import MemoryStore
from ratewarden.integrations.django import limit
from ratewarden.rules import RuleEngine, loads

engine = RuleEngine(loads("rules: [{name: per-ip, rate: 1/minute, by: ip}]"), MemoryStore())
view = limit(engine)(lambda request: HttpResponse("ok"))
statuses = [view(RequestFactory().get("/")).status_code for _ in range(2)]
assert statuses == [200, 429], statuses
urlpatterns = []
"""

HTTPX = """
import httpx
from ratewarden import Limiter
from ratewarden.integrations.httpx import RateLimitTransport
provider = httpx.MockTransport(lambda request: httpx.Response(200))
with httpx.Client(transport=RateLimitTransport(Limiter("10/second"), provider, max_wait=5.0)) as c:
    assert c.get("https://api.partner.example/orders").status_code == 200
"""

AIOHTTP = """
import aiohttp
from ratewarden import AsyncLimiter
from ratewarden.integrations.aiohttp import RateLimitMiddleware
RateLimitMiddleware(AsyncLimiter("10/second"), max_wait=1.0)
"""

FLEET = """
import hiredis
from ratewarden.fleet import FleetQuota, QuotaConfig
"""

# An engine's checks read by the SDK's in-memory reader; the OTLP exporter over HTTP
# is there, and no grpcio came with it.
OTEL = """
import importlib.util
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from ratewarden import MemoryStore
from ratewarden.otel import instrument
from ratewarden.rules import RuleEngine, loads
assert importlib.util.find_spec("grpc") is None, "the otel extra installs grpcio"
engine = RuleEngine(loads("rules: [{name: per-ip, rate: 1/minute, by: ip}]"), MemoryStore())
reader = InMemoryMetricReader()
instrument(engine, meter_provider=MeterProvider(metric_readers=[reader]))
for _ in range(2):
    engine.check({"ip": "10.0.0.1"})
exported = reader.get_metrics_data().to_json()
assert '"ratewarden.over_limit"' in exported and "10.0.0.1" not in exported, exported
"""

# serve --otel with the console exporter: the counts printed when it stops
SERVER_OTEL = """
import json, os, socket, subprocess, sys, urllib.request
from pathlib import Path
ratewarden_cli = Path(sys.executable).parent / "ratewarden"
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
serving = subprocess.Popen([ratewarden_cli, "serve", "--demo", "--http", f"127.0.0.1:{port}",
                            "--grpc", "off", "--otel"], stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "OTEL_METRICS_EXPORTER": "console"})
try:
    assert "HTTP on" in serving.stdout.readline()
    check = json.dumps({"attributes": {"path": "/api/login", "ip": "203.0.113.7"}}).encode()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/check", check, timeout=10) as a:
        assert a.status == 200
finally:
    serving.terminate()
    assert serving.wait(30) == 0
printed = serving.stdout.read()
assert '"ratewarden.checks"' in printed and "203.0.113.7" not in printed, printed
"""

# extra -> (what pip is asked for, the check); "core" is the bare wheel
CHECKS: dict[str, tuple[str, str]] = {
    "core": ("", CORE),
    "rules": ("rules", RULES),
    "redis": ("redis", REDIS),
    "server": ("server", SERVER_ONLY),
    "grpc": ("server,grpc", SERVER),
    "fastapi": ("fastapi", FASTAPI),
    "flask": ("flask", FLASK),
    "django": ("django", DJANGO),
    "httpx": ("httpx", HTTPX),
    "aiohttp": ("aiohttp", AIOHTTP),
    "fleet": ("fleet", FLEET),
    "otel": ("otel", OTEL),
    "server+otel": ("server,otel", SERVER_OTEL),
}


def constraints(directory: Path) -> Path:
    """The lock's pins without their hashes: the versions the suite passes with."""
    pins = [
        line.rstrip(" \\")
        for line in LOCK.read_text().splitlines()
        if re.match(r"[A-Za-z0-9]", line)
    ]
    path = directory / "constraints.txt"
    path.write_text("\n".join(pins) + "\n")
    return path


def build_wheel(directory: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(directory), str(ROOT)],
        check=True, capture_output=True,
    )  # fmt: skip
    # setuptools leaves build/lib behind: a stale copy must not feed the next build
    shutil.rmtree(ROOT / "build" / "lib", ignore_errors=True)
    (wheel,) = directory.glob("ratewarden-*.whl")
    return wheel


def check(extra: str, wheel: Path, pins: Path, directory: Path) -> str | None:
    """None when the extra installs and its check passes, else what went wrong."""
    wanted, code = CHECKS[extra]
    venv = directory / f"venv-{extra}"  # not the bare name: "grpc" would import from cwd
    uv = str(BIN / "uv")
    python = venv / "bin" / "python"
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    requirement = f"ratewarden[{wanted}] @ {wheel.as_uri()}" if wanted else str(wheel)
    install = subprocess.run(
        [uv, "pip", "install", "-q", "--python", str(python), "-c", str(pins), requirement],
        check=False, capture_output=True, text=True,
    )  # fmt: skip
    if install.returncode:
        return f"pip install failed:\n{install.stderr}"
    # from another directory, so the checkout's src/ cannot stand in for the wheel
    run = subprocess.run(
        [str(python), "-c", code],
        check=False, capture_output=True, text=True, cwd=directory, timeout=120,
    )  # fmt: skip
    if run.returncode:
        return run.stderr.strip()
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("extras", nargs="*", help=f"of {', '.join(CHECKS)}; default: all")
    extras = parser.parse_args().extras or list(CHECKS)
    unknown = sorted(set(extras) - set(CHECKS))
    if unknown:
        parser.error(f"no check for {', '.join(unknown)}; there are {', '.join(CHECKS)}")
    if not (BIN / "uv").exists():
        print(f"check_wheels: no uv beside {sys.executable}; run ./dev test", file=sys.stderr)
        return 2
    started = time.monotonic()
    failed = []
    with tempfile.TemporaryDirectory(prefix="ratewarden-wheels-") as name:
        directory = Path(name)
        wheel = build_wheel(directory)
        pins = constraints(directory)
        for extra in extras:
            problem = check(extra, wheel, pins, directory)
            print(f"check_wheels: {extra:8} {'ok' if problem is None else 'FAILED'}")
            if problem is not None:
                print("    " + problem.replace("\n", "\n    "), file=sys.stderr)
                failed.append(extra)
    took = time.monotonic() - started
    print(f"check_wheels: {len(extras) - len(failed)} passed, {len(failed)} failed in {took:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
