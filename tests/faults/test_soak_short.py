"""bench/soak.py for 20 seconds instead of 10 minutes, with looser bounds: the same
code (a Redis of its own, ``ratewarden serve``, open-loop HTTP and gRPC load,
RSS, descriptors and p99 per window), so the documented soak keeps working."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


def load_soak() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_a_short_soak_holds_steady(tmp_path: Path) -> None:
    soak = load_soak()
    args = soak.parser().parse_args([
        "--minutes", str(20 / 60), "--window", "5", "--sample", "1", "--rate", "500",
        # 15 s after a 5 s warm-up: caches may still be filling, and one window's
        # p99 on this shared VM swings with whatever else runs
        "--rss-growth", "0.10", "--p99-ratio", "3", "--p99-floor", "25",
        "--json", str(tmp_path / "soak.json"),
    ])  # fmt: skip
    figures, verdict = asyncio.run(soak.soak(args))
    assert len(figures) == 4
    assert sum(f.requests for f in figures) == 500 * 20
    assert verdict.ok, verdict.failures
    assert (tmp_path / "soak.json").exists()
