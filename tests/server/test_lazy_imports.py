"""The service on the memory store loads no Redis client, and of the fleet's code
only the pure parts its quota service runs (the coordinator's model)."""

from __future__ import annotations

import subprocess
import sys

PURE = {
    "ratewarden.fleet",
    "ratewarden.fleet._coordinator_calls",
    "ratewarden.fleet.alloc",
    "ratewarden.fleet.config",
    "ratewarden.fleet.coordinator",
    "ratewarden.fleet.model",
}


def test_the_app_and_the_grpc_service_load_no_redis_client() -> None:
    code = (
        "import sys, ratewarden.server._app, ratewarden.server._grpc_server\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'redis'"
        " or m.startswith('ratewarden.fleet')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(eval(done.stdout))
    assert "redis" not in loaded
    assert loaded <= PURE, loaded - PURE


def test_serving_http_loads_no_uvicorn() -> None:
    """The service's HTTP server is ours, on httptools alone: the server extra
    does not install uvicorn, so nothing that serves may import it."""
    code = (
        "import sys, ratewarden.server._serve, ratewarden.server._http_server\n"
        "import ratewarden.server._app, ratewarden.server._process\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('uvicorn', 'starlette')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
