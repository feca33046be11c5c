"""Write the sync twins of the async modules that must be classes of their own.

    ./dev twins                   # write every generated file, with the locked ruff
    ./dev twins --check           # write nothing: exit 1 naming each one that differs

(``./dev twins ARGS`` is ``.venv/bin/python scripts/unasync.py ARGS``.)

The async module is the one a person edits; its sync twin is made from it by
renaming tokens (``async def`` -> ``def``, ``await x`` -> ``x``, ``AsyncFoo`` ->
``Foo``, ``aclose`` -> ``close`` ...), then formatted by ruff. Where the two must
differ in more than names (a task against a thread), the async module says so
with a pair of markers, and the sync text between them is written in the
comment lines that follow ``# unasync: sync``::

    # unasync: async
    task = asyncio.create_task(self._run())
    # unasync: sync
    # thread = threading.Thread(target=self._run, daemon=True)
    # thread.start()
    # unasync: end

An async module asks for its twin, and for renames of its own (whole words,
applied before the common ones), in comments at its top::

    # unasync: twin _quota.py
    # unasync: rename asyncio.sleep -> time.sleep

`./dev test` runs ``--check`` (tests/test_twins.py): a generated file edited by
hand, or an async one changed without running this script, fails the run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "ratewarden"

# renames every twin takes, applied as whole words, in this order
COMMON: tuple[tuple[str, str], ...] = (
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\b__aiter__\b", "__iter__"),
    (r"\b__anext__\b", "__next__"),
    (r"\bStopAsyncIteration\b", "StopIteration"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bAsyncGenerator\b", "Generator"),
    (r"\bAwaitable\[([^\]]*)\]", r"\1"),
    (r"\baclose\b", "close"),
    (r"\bAsync([A-Z]\w*)", r"\1"),
)


@dataclass(frozen=True)
class Twin:
    source: Path  # the async module
    target: Path  # its generated sync twin
    renames: tuple[tuple[str, str], ...] = field(default=())  # this pair's own, first


# two lines, so that a generated file keeps within the line length
HEADER = (
    "# Generated from {source} by scripts/unasync.py:\n# edit that file, then run the script.\n"
)
_TWIN = re.compile(r"^# unasync: twin (\S+)$", re.M)
_RENAME = re.compile(r"^# unasync: rename (\S+) -> (\S*)$", re.M)


def twins() -> list[Twin]:
    """Every async module that asks for a twin, in path order."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        target = _TWIN.search(text)
        if target is None:
            continue
        renames = tuple(
            (r"(?<![\w.])" + re.escape(old) + r"(?!\w)", new) for old, new in _RENAME.findall(text)
        )
        found.append(Twin(path, path.parent / target.group(1), renames))
    return found


def _markers(text: str) -> str:
    """Keep the sync side of each ``# unasync:`` block, uncommented."""
    out: list[str] = []
    mode = None
    for line in text.splitlines(keepends=True):
        tag = line.strip()
        if tag == "# unasync: async":
            mode = "async"
        elif tag == "# unasync: sync":
            mode = "sync"
        elif tag == "# unasync: end":
            mode = None
        elif mode == "async":
            continue
        elif mode == "sync":
            indent = line[: len(line) - len(line.lstrip())]
            body = line.strip()
            if not body.startswith("#"):
                raise SystemExit(f"unasync: a sync block's line is not a comment: {line!r}")
            out.append(indent + body[1:].removeprefix(" ") + "\n")
        else:
            out.append(line)
    if mode is not None:
        raise SystemExit("unasync: an '# unasync:' block is not ended")
    return "".join(out)


def generate(twin: Twin) -> str:
    text = twin.source.read_text()
    text = _TWIN.sub("", _RENAME.sub("", text)).replace("\n\n\n\n", "\n\n\n")
    text = _markers(text)
    for pattern, replacement in (*twin.renames, *COMMON):
        text = re.sub(pattern, replacement, text)
    where = twin.source
    source = where.relative_to(ROOT).as_posix() if where.is_relative_to(ROOT) else where.name
    text = HEADER.format(source=source) + text
    formatted = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(twin.target), "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    fixed = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--fix-only", "--quiet", "--stdin-filename",
         str(twin.target), "-"],
        input=formatted.stdout,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )  # fmt: skip
    return fixed.stdout or formatted.stdout


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for twin in twins():
        text = generate(twin)
        if check:
            if not twin.target.exists() or twin.target.read_text() != text:
                stale.append(twin.target.relative_to(ROOT).as_posix())
        else:
            twin.target.write_text(text)
    if stale:
        print("unasync: out of date (run ./dev twins): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
