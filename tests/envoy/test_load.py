"""Loading a large envoy configuration stays linear and quick (what
bench/bench_envoy_load.py times): checked by what the load does, not by a clock."""

from __future__ import annotations

import gc
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, ModuleType

import pytest

from ratewarden.rules import EnvoyConfig, RuleFileError

BENCH = Path(__file__).parent.parent.parent / "bench" / "bench_envoy_load.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_envoy_load", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(bench: ModuleType, n: int, directory: Path) -> Path:
    directory.mkdir()
    bench.write_files(n, directory)
    return directory


def test_ten_thousand_descriptors_load_and_answer(bench: ModuleType, tmp_path: Path) -> None:
    cfg = EnvoyConfig.load(write(bench, 10_000, tmp_path / "c"))
    assert sum(bench._count(level) for level in cfg.domains.values()) == 10_000
    last = len(cfg.domains) - 1
    for d in (0, last):
        domain = f"domain{d}"
        exact = cfg.limits_for(domain, [[("k0", "v0")]])[0]
        assert exact is not None
        assert exact.requests_per_unit == 10
        nested = cfg.limits_for(domain, [[("tenant", "t4"), ("user", "anyone")]])[0]
        assert nested is not None
        assert nested.requests_per_unit == 14
        shared = cfg.limits_for(domain, [[("path", "/files6/abc/xyz")]])[0]
        assert shared is not None
        assert shared.key == f"{domain}|path=/files6/*/x*"


def calls_to_load(directory: Path) -> int:
    count = 0

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    try:
        EnvoyConfig.load(directory)
    finally:
        sys.setprofile(None)
    return count


def test_the_work_grows_linearly(bench: ModuleType, tmp_path: Path) -> None:
    """Twice the descriptors, twice the calls (a pairwise check would make it
    four times): the duplicate checks are lookups, not scans."""
    small = calls_to_load(write(bench, 2_000, tmp_path / "small"))
    large = calls_to_load(write(bench, 4_000, tmp_path / "large"))
    assert 1.8 < large / small < 2.2


def test_many_wildcards_of_one_key_and_a_duplicate_among_them(tmp_path: Path) -> None:
    lines = ["domain: d", "descriptors:"]
    for i in range(5_000):
        lines += [
            "  - key: path",
            f"    value: /p{i}/*",
            "    rate_limit: {unit: second, requests_per_unit: 1}",
        ]
    (tmp_path / "ok.yaml").write_text("\n".join(lines) + "\n")
    cfg = EnvoyConfig.load(tmp_path / "ok.yaml")
    found = cfg.limits_for("d", [[("path", "/p4999/x")]])[0]
    assert found is not None
    assert found.stats_key == "d.path_/p4999/*"
    lines += ["  - key: path", "    value: /p17/*"]
    (tmp_path / "bad.yaml").write_text("\n".join(lines) + "\n")
    with pytest.raises(
        RuleFileError, match=r"duplicate descriptor composite key 'd\.path_/p17/\*'"
    ):
        EnvoyConfig.load(tmp_path / "bad.yaml")


@pytest.fixture
def collections() -> Iterator[list[int]]:
    seen: list[int] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        """A collection that starts while files are parsed or trees built (the one
        just after, when the collector catches up, is what it is meant to do)."""
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_name in ("parse_files", "build"):
                if phase == "start":
                    seen.append(info["generation"])
                return
            frame = frame.f_back  # type: ignore[assignment]

    gc.callbacks.append(callback)
    try:
        yield seen
    finally:
        gc.callbacks.remove(callback)


def test_the_collector_waits_until_the_load_is_done(
    bench: ModuleType, tmp_path: Path, collections: list[int]
) -> None:
    """A load makes containers and frees none: collections during it find
    nothing and cost more than the load (bench/RESULTS.md)."""
    directory = write(bench, 3_000, tmp_path / "c")
    assert gc.isenabled()
    gc.collect()  # from an empty young generation: none is due before the load starts
    collections.clear()
    EnvoyConfig.load(directory)
    assert collections == []
    assert gc.isenabled()
