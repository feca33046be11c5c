"""Write the sync twins of the async modules that must be classes of their own.

    ./dev twins                   # write every generated file, with the locked ruff
    ./dev twins --check           # write nothing: exit 1 naming each one that differs
    ./dev twins --root DIR        # the same on a copy: DIR/src/ratewarden/...

(``./dev twins ARGS`` is ``.venv/bin/python scripts/unasync.py ARGS``.)

The async module is the one a person edits; its sync twin is made from it by
renaming tokens (``async def`` -> ``def``, ``await x`` -> ``x``, ``AsyncFoo`` ->
``Foo``, ``aclose`` -> ``close`` ...), then formatted by ruff, which also drops
the imports the twin no longer uses and sorts the rest. Where the two must
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

A twin is ruff's output, and that changes between releases (ruff 0.6 leaves
``f"{x+1}" "s"`` as it is, 0.9 and later write ``f"{x + 1}s"``): pyproject.toml's
dev extra pins ruff exactly, and the script refuses to run on any other version,
so that no twin one ruff writes is stale under another. To move to a new ruff,
change the pin, ``./dev lock``, then ``./dev twins`` and commit what it rewrites.

`./dev test` runs ``--check`` (tests/test_twins.py): a generated file edited by
hand, or an async one changed without running this script, fails the run.
"""

from __future__ import annotations

import argparse
import functools
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the repository's ruff settings, also for a twin written into a copy elsewhere
CONFIG = ROOT / "pyproject.toml"

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


def twins(root: Path = ROOT) -> list[Twin]:
    """Every async module under ``root``'s src/ratewarden that asks for a twin, in path order."""
    found = []
    for path in sorted((root / "src" / "ratewarden").rglob("*.py")):
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


def pinned_ruff() -> str:
    """The ruff version that pyproject.toml's dev extra pins, which writes the twins."""
    config = tomllib.loads(CONFIG.read_text())
    for requirement in config["project"]["optional-dependencies"]["dev"]:
        if re.match(r"ruff\b(?!-)", requirement):
            pin = re.fullmatch(r"ruff\s*==\s*([\w.]+)", requirement.strip())
            if pin is None:
                break
            return pin.group(1)
    raise SystemExit(
        "unasync: pyproject.toml's dev extra must pin ruff exactly (ruff==X.Y.Z): "
        "the twins are its output"
    )


@functools.cache
def _check_ruff() -> None:
    """Stop before any twin is written or compared by a ruff other than the pinned one."""
    wanted = pinned_ruff()
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "--version"], capture_output=True, text=True, check=False
    )
    words = done.stdout.split()
    found = words[-1] if done.returncode == 0 and words else None
    if found != wanted:
        have = f"ruff {found}" if found else "no ruff"
        raise SystemExit(
            f"unasync: the twins are ruff {wanted}'s output (pyproject.toml pins it), and "
            f"{sys.executable} has {have}: run ./dev twins, which uses the locked venv, "
            f"or install ruff=={wanted}"
        )


def _ruff(args: list[str], text: str) -> str:
    _check_ruff()
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--config", str(CONFIG), "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"unasync: ruff {args[0]} failed: {done.stderr.strip()}")
    return done.stdout


def generate(twin: Twin, root: Path = ROOT) -> str:
    """The sync twin's text (``root``: the tree its header names the source from)."""
    text = twin.source.read_text()
    text = _TWIN.sub("", _RENAME.sub("", text)).replace("\n\n\n\n", "\n\n\n")
    text = _markers(text)
    for pattern, replacement in (*twin.renames, *COMMON):
        text = re.sub(pattern, replacement, text)
    where = twin.source
    source = where.relative_to(root).as_posix() if where.is_relative_to(root) else where.name
    text = HEADER.format(source=source) + text
    name = str(twin.target)
    text = _ruff(["format", "--stdin-filename", name], text)
    # --fix-only exits 0 whatever it leaves unfixed: the lint run reports that
    return _ruff(["check", "--fix-only", "--quiet", "--stdin-filename", name], text)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/unasync.py", description="Write the sync twins of the async modules."
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing: exit 1 naming each twin that differs"
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=ROOT,
        help="the tree whose src/ratewarden holds the modules (default: this repository)",
    )
    args = parser.parse_args(argv)
    root: Path = args.root.resolve()
    found = twins(root)
    if not found:
        print(f"unasync: no module under {root}/src/ratewarden asks for a twin", file=sys.stderr)
        return 2
    stale = []
    for twin in found:
        text = generate(twin, root)
        if args.check:
            if not twin.target.exists() or twin.target.read_text() != text:
                stale.append(twin.target.relative_to(root).as_posix())
        else:
            twin.target.write_text(text)
    if stale:
        print("unasync: out of date (run ./dev twins): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
