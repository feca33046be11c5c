"""Guards on the project's own configuration: strictness that silently vanishes
(a deleted line, a renamed section) fails here instead."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_mypy_is_strict_on_src_tests_and_scripts() -> None:
    """The tests are checked too, tests/typing/api.py's checks of the public API among them."""
    mypy = CONFIG["tool"]["mypy"]
    assert mypy["strict"] is True
    assert mypy["files"] == ["src", "tests", "scripts"]
    assert (ROOT / "tests" / "typing" / "api.py").exists()
    assert "ignore-without-code" in mypy["enable_error_code"]


def test_pytest_is_strict() -> None:
    pytest_config = CONFIG["tool"]["pytest"]["ini_options"]
    assert {"--strict-markers", "--strict-config"} <= set(pytest_config["addopts"])
    assert pytest_config["xfail_strict"] is True
    assert pytest_config["filterwarnings"] == ["error"]


def test_core_depends_on_no_server_package() -> None:
    assert CONFIG["project"]["dependencies"] == ["msgspec>=0.18"]
    assert (ROOT / "src" / "ratewarden" / "py.typed").exists()


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "./dev test" in readme
    assert "exec ./dev test" in (ROOT / ".ci" / "run").read_text()


def test_the_version_is_written_once() -> None:
    import ratewarden  # noqa: PLC0415

    assert ratewarden.__version__ == CONFIG["project"]["version"]
    assert "__version__ =" not in (ROOT / "src" / "ratewarden" / "__init__.py").read_text()


def test_no_ruff_ignore_goes_unused() -> None:
    """Each ignored rule is one the code would break: an ignore nothing needs hides
    the next real violation of it."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    ruff = Path(sys.executable).parent / "ruff"
    for rule in CONFIG["tool"]["ruff"]["lint"]["ignore"]:
        done = subprocess.run(
            [str(ruff), "check", "--isolated", "--select", rule, "--output-format", "concise",
             "--exit-zero", "src", "tests", "bench", "examples"],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert rule in done.stdout, f"ruff ignores {rule}, which nothing triggers"
