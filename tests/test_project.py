"""Guards on the project's own configuration: strictness that silently vanishes
(a deleted line, a renamed section) fails here instead."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest

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


def _requirement_name(requirement: str) -> str:
    import re  # noqa: PLC0415

    name = re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_lock_pins_every_dev_dependency_with_hashes() -> None:
    """`./dev` installs requirements/dev.txt with --no-deps: a dependency added to
    pyproject.toml but not locked (`./dev lock`) would be missing from the venv."""
    lock = (ROOT / "requirements" / "dev.txt").read_text()
    pinned = {_requirement_name(line) for line in lock.splitlines() if line[:1].isalnum()}
    extras = CONFIG["project"]["optional-dependencies"]
    wanted = {_requirement_name(r) for r in extras["dev"] if not r.startswith("ratewarden")}
    wanted |= {_requirement_name(r) for r in extras["server"] + extras["grpc"]}
    assert wanted - pinned == set()
    pins = [line for line in lock.splitlines() if line[:1].isalnum()]
    assert all(" \\" in line and "==" in line for line in pins)  # a hash follows each
    # the service's HTTP server is its own: no ASGI server in its extra
    assert "uvicorn" not in {_requirement_name(r) for r in extras["server"]}


def test_dev_installs_the_lock_and_a_new_lock_makes_a_new_venv() -> None:
    dev = (ROOT / "dev").read_text()
    assert "LOCK=requirements/dev.txt" in dev
    assert 'STAMP=$VENV/.installed-$(cat pyproject.toml "$LOCK" | sha1sum' in dev
    assert '--require-hashes --no-deps -r "$LOCK"' in dev
    assert "--require-hashes -r requirements/gateways.txt" in dev
    assert "scripts/check_wheels.py" in dev


def test_dev_run_installs_what_serving_needs_only() -> None:
    """`./dev run` has a lock of its own: the service's extras at the dev lock's
    versions, with hashes, and none of the test tools (a 922 MB venv otherwise)."""
    dev = (ROOT / "dev").read_text()
    assert '--require-hashes --no-deps -r "$RUN_LOCK"' in dev
    assert 'exec "$RUN_VENV/bin/ratewarden" serve "${demo[@]}" "$@"' in dev
    run = (ROOT / "requirements" / "run.txt").read_text()
    pins = dict(line.split(" ")[0].split("==") for line in run.splitlines() if line[:1].isalnum())
    extras = CONFIG["project"]["optional-dependencies"]
    wanted = {_requirement_name(r) for r in extras["server"] + extras["grpc"]}
    assert wanted - set(pins) == set()
    assert {"mypy", "pytest", "playwright", "django", "ruff"} & set(pins) == set()
    dev_lock = (ROOT / "requirements" / "dev.txt").read_text()
    for name, version in pins.items():
        assert f"\n{name}=={version} \\" in dev_lock, f"{name} {version}: not the dev lock's"


@pytest.mark.parametrize(
    ("args", "runs"),
    [
        ("", "ratewarden serve --demo"),
        ("--http 9090", "ratewarden serve --demo --http 9090"),
        ("--rules my.yaml", "ratewarden serve --rules my.yaml"),
        ("--config=my.yaml", "ratewarden serve --config=my.yaml"),
        ("--config-reload-interval 5", "ratewarden serve --demo --config-reload-interval 5"),
    ],
)
def test_dev_run_passes_its_arguments_and_adds_the_demo_rules_unless_a_rule_file(
    args: str, runs: str
) -> None:
    done = subprocess.run([str(ROOT / "dev"), "run", *args.split()], capture_output=True,
                          text=True, check=True, env={**os.environ, "DEV_RUN_ECHO": "1"},
                          timeout=30)  # fmt: skip
    assert done.stdout.strip() == runs


def test_check_wheels_covers_every_extra() -> None:
    """Each extra a user can ask for is installed alone and used; grpc is checked
    with server (the README installs them together; server alone is checked too),
    simulate is matplotlib's plots. A check named ``a+b`` installs two extras that
    work together (serve --otel)."""
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.spec_from_file_location(
        "check_wheels", ROOT / "scripts" / "check_wheels.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    extras = set(CONFIG["project"]["optional-dependencies"]) - {"dev", "simulate"}
    alone = {name for name in module.CHECKS if "+" not in name}
    assert extras | {"core"} == alone
    assert module.CHECKS["grpc"][0] == "server,grpc"
    together = {part for name in module.CHECKS if "+" in name for part in name.split("+")}
    assert together <= extras
