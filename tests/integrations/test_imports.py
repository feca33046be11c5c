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
