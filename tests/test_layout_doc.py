"""docs/architecture.md's Layout table names every package and every module in
it, and no private module that is gone: a reader finds where a job lives."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "ratewarden"


def rows() -> dict[Path, set[str]]:
    """The names each package's rows quote (``ratewarden`` has two: its kernel
    and its limiter), by the package's directory."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.partition("\n## Layout\n")[2].partition("\n\n|")[2]
    found: dict[Path, set[str]] = {}
    for line in ("|" + table).partition("\n\n")[0].splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert len(cells) == 4, line
        package = re.match(r"`([\w/]+)`", cells[1])
        assert package, line
        name = package.group(1).rstrip("/")
        where = PACKAGE if name == "ratewarden" else PACKAGE / name
        found.setdefault(where, set()).update(re.findall(r"`([^`]+)`", " ".join(cells[1:3])))
    return found


def modules(package: Path) -> set[str]:
    """A package's own modules (its subpackages aside), and its Lua files."""
    names = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    return names | {p.name for p in package.glob("*.lua")}


def test_every_package_has_a_row() -> None:
    packages = {p.parent for p in PACKAGE.rglob("__init__.py")}
    assert set(rows()) == packages


def test_every_module_is_named_in_its_packages_row() -> None:
    for package, named in rows().items():
        missing = sorted(modules(package) - named)
        assert not missing, f"docs/architecture.md, the row of {package.name}/: add {missing}"


def test_every_private_module_named_exists() -> None:
    for package, named in rows().items():
        gone = sorted({n for n in named if re.fullmatch(r"_[a-z][a-z_0-9]*", n)} - modules(package))
        assert not gone, f"docs/architecture.md, the row of {package.name}/ names {gone}"
