"""The benchmark's two sides agree: the index returns what a linear scan over the
same rules returns, on the benchmark's own rules and requests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from ratewarden.rules._compile import compile_rules

BENCH = Path(__file__).parent.parent.parent / "bench" / "bench_rules.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_rules", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("size", [10, 1000])
def test_index_and_linear_scan_agree(bench: ModuleType, size: int) -> None:
    ruleset = compile_rules(bench.make_rules(size))
    anchor = bench.LinearScan(ruleset)
    requests = bench.make_requests(size, 400)
    total = 0
    for attributes in requests:
        ours = sorted((a.rule.name, a.key) for a in ruleset.evaluate(attributes))
        naive = sorted((r.name, k) for r, k in anchor.evaluate(attributes) for _ in r.limits)
        assert ours == naive, attributes
        total += len(ours)
    assert 2 < total / len(requests) < 4  # the mix the figures are quoted for
