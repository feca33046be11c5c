"""The sync twins that scripts/unasync.py writes from their async modules."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "unasync.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # its dataclasses look their module up in sys.modules while they are made
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_generated_twin_is_what_the_script_writes() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_a_twin_is_renamed_and_marked_blocks_take_their_sync_side(tmp_path: Path) -> None:
    unasync = _script()
    source = tmp_path / "_athing.py"
    source.write_text(
        '"""`AsyncThing`: waits."""\n'
        "\n"
        "# unasync: twin _thing.py\n"
        "# unasync: rename asyncio.sleep -> time.sleep\n"
        "import asyncio\n"
        "\n"
        "\n"
        "class AsyncThing:\n"
        "    async def await_it(self) -> None:\n"
        "        await asyncio.sleep(1)\n"
        "        async with self.lock:\n"
        "            pass\n"
        "        # unasync: async\n"
        "        self.task = asyncio.create_task(self.aclose())\n"
        "        # unasync: sync\n"
        "        # self.thread = start(self.close)\n"
        "        # unasync: end\n"
        "\n"
        "    async def aclose(self) -> None:\n"
        "        pass\n"
    )
    twin = unasync.Twin(
        source, tmp_path / "_thing.py", ((r"(?<![\w.])asyncio\.sleep(?!\w)", "time.sleep"),)
    )
    text = unasync.generate(twin)
    assert text.startswith("# Generated from _athing.py by scripts/unasync.py")
    body = text.removeprefix(unasync.HEADER.format(source="_athing.py"))
    assert "class Thing:" in body
    assert "    def await_it(self) -> None:\n        time.sleep(1)\n        with self.lock:" in body
    assert "self.thread = start(self.close)" in body
    assert "create_task" not in body
    assert "unasync:" not in body
    assert "async" not in body.replace("asyncio", "")


def _copy(tmp_path: Path, *, targets: bool) -> list[tuple[Path, Path]]:
    """The async modules (and the committed twins, if ``targets``) copied into
    ``tmp_path`` at their paths in the repository: (copy, original) for each twin."""
    pairs = []
    for twin in _script().twins():
        for path in (twin.source, twin.target) if targets else (twin.source,):
            copy = tmp_path / path.relative_to(ROOT)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, copy)
        pairs.append((tmp_path / twin.target.relative_to(ROOT), twin.target))
    return pairs


def test_the_script_writes_the_committed_twins_byte_for_byte(tmp_path: Path) -> None:
    """What `./dev twins` would write, written into a copy of the async modules."""
    pairs = _copy(tmp_path, targets=False)
    assert _script().main(["--root", str(tmp_path)]) == 0
    for copy, original in pairs:
        assert copy.read_bytes() == original.read_bytes(), original


def test_a_generated_file_edited_by_hand_fails_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unasync = _script()
    pairs = _copy(tmp_path, targets=True)
    assert unasync.main(["--check", "--root", str(tmp_path)]) == 0  # the copy is faithful
    edited, original = pairs[-1]
    text = edited.read_text()
    assert "\n\n\n" in text
    edited.write_text(text.replace("\n\n\n", "\n\n", 1))  # one blank line fewer
    kept = original.read_bytes()
    assert unasync.main(["--check", "--root", str(tmp_path)]) == 1
    named = edited.relative_to(tmp_path).as_posix()
    assert capsys.readouterr().err.rstrip().endswith(f"out of date (run ./dev twins): {named}")
    assert original.read_bytes() == kept


def test_ruff_is_pinned_exactly_and_locked_at_the_pin() -> None:
    """The twins are ruff's output: the newest releases pyproject.toml allows
    (./dev test-latest) and the lock (./dev test) must be one ruff."""
    pinned = _script().pinned_ruff()
    lock = (ROOT / "requirements" / "dev.txt").read_text()
    assert re.findall(r"^ruff==(\S+) ", lock, re.M) == [pinned]


def test_another_ruff_stops_the_script_naming_the_pinned_one(tmp_path: Path) -> None:
    """A ruff that reports 0.6.9, found first on the path: the script names both
    versions and how to get the pinned one, and writes no twin."""
    fake = tmp_path / "path" / "ruff"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text('print("ruff 0.6.9")\n')
    pairs = _copy(tmp_path / "tree", targets=False)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(tmp_path / "tree")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "path")},
        check=False,
    )
    assert done.returncode == 1
    pinned = _script().pinned_ruff()
    assert f"the twins are ruff {pinned}'s output" in done.stderr
    assert "has ruff 0.6.9: run ./dev twins" in done.stderr
    assert f"install ruff=={pinned}" in done.stderr
    assert not any(copy.exists() for copy, _ in pairs)


def test_hand_written_twins_mirror_fewer_than_100_lines() -> None:
    """Logic written once, twins doing only their I/O: what they still mirror is
    signatures and driving loops. A new pair of hand copies shows up here."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "twin_lines.py")],
        capture_output=True,
        text=True,
        check=True,
    )
    total = int(done.stdout.strip().splitlines()[-1].split()[0])
    assert 0 < total < 100, done.stdout
