"""The service on the memory store loads no Redis client and no fleet code."""

from __future__ import annotations

import subprocess
import sys


def test_the_app_and_the_grpc_service_load_no_redis_client() -> None:
    code = (
        "import sys, ratewarden.server._app, ratewarden.server._grpc_server\n"
        "print(sorted(m for m in sys.modules if m == 'redis' or m.startswith('ratewarden.fleet')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


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
