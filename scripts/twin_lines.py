"""How many lines the hand-written sync/async twins of src/ still mirror.

    python scripts/twin_lines.py [SRC]     # default: src/ratewarden

Twins are two top-level classes or functions whose names differ only by the
async prefix (``AsyncLimiter``/``Limiter``, ``abind``/``bind``). Their lines are
compared after the async words are taken out (``async``, ``await``, ``Async``,
an ``a`` before a twin method's name); every run of four or more lines that then
reads the same on both sides is mirrored. Files that scripts/unasync.py
generates are left out: they are copies that a check keeps true.
"""

from __future__ import annotations

import ast
import difflib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

GENERATED = "# Generated from "
RUN = 4


@dataclass(frozen=True)
class Unit:
    path: Path
    name: str
    first: int
    lines: tuple[str, ...]


def _plain(name: str) -> str:
    if name.startswith("Async") and name[5:6].isupper():
        return name[5:]
    if name.startswith("_Async") and name[6:7].isupper():
        return "_" + name[6:]
    return name


_VERBS = "close|hit|bind|check|peek|reset|acquire|refresh|run|wait|sleep"


def _normal(line: str) -> str:
    line = re.sub(r"\basync (def|with|for)\b", r"\1", line.strip())
    line = re.sub(r"\bawait ", "", line)
    line = re.sub(r"\bAsync(?=[A-Z])", "", line)
    line = re.sub(rf"\ba(?=({_VERBS})\w*\()", "", line)
    return re.sub(r"\b__a(enter|exit|iter|next)__\b", r"__\1__", line)


def units(src: Path) -> list[Unit]:
    found = []
    for path in sorted(src.rglob("*.py")):
        text = path.read_text()
        if text.startswith(GENERATED):
            continue
        lines = text.splitlines()
        for node in ast.parse(text).body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                body = tuple(lines[node.lineno - 1 : node.end_lineno])
                found.append(Unit(path, node.name, node.lineno, body))
    return found


def pairs(found: list[Unit]) -> list[tuple[Unit, Unit]]:
    by_name: dict[str, list[Unit]] = {}
    for unit in found:
        by_name.setdefault(unit.name, []).append(unit)
    out = []
    for unit in found:
        twin = _plain(unit.name)
        if twin == unit.name and unit.name.startswith("a") and unit.name[1:] in by_name:
            twin = unit.name[1:]
        if twin != unit.name:
            out += [(unit, other) for other in by_name.get(twin, [])]
    return out


def mirrored(a: Unit, b: Unit) -> int:
    def kept(unit: Unit) -> list[str]:
        code = [line for line in unit.lines if line.strip() and not line.strip().startswith("#")]
        return [_normal(line) for line in code]

    left, right = kept(a), kept(b)
    matcher = difflib.SequenceMatcher(None, left, right, autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks() if block.size >= RUN)


def main(argv: list[str]) -> int:
    src = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / "src" / "ratewarden"
    total = 0
    rows = []
    for a, b in pairs(units(src)):
        count = mirrored(a, b)
        if count:
            total += count
            rows.append((count, f"{a.path.relative_to(src)}:{a.first} {a.name} ~ "
                                f"{b.path.relative_to(src)}:{b.first} {b.name}"))  # fmt: skip
    for count, row in sorted(rows, reverse=True):
        print(f"{count:5d}  {row}")
    print(f"{total} mirrored lines in {len(rows)} twin pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
