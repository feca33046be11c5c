"""The package's walls, read from its imports (docs/architecture.md draws them).

- A module whose name starts with ``_`` belongs to its package: only modules
  inside that package import it. What a package offers its neighbours is its
  ``__init__`` and its modules without the underscore.
- Each package sits on a layer and imports only from layers below it (or its
  own package); two packages on one layer know nothing of each other.
- No cycle among the imports that run when a module is imported (those at
  module level, outside ``if TYPE_CHECKING:``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"

# lowest first; a module is placed by the longest prefix that names it
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "ratewarden._clock",
        "ratewarden._decision",
        "ratewarden._errors",
        "ratewarden._rate",
        "ratewarden._flow",
        "ratewarden.primitives",  # the public face of the modules above, for subpackages
    ),
    ("ratewarden.algorithms",),
    ("ratewarden.stores",),
    (
        "ratewarden._limiter",
        "ratewarden._hitmany",
        "ratewarden._waiting",
        "ratewarden._queue",
        "ratewarden._headers",
        "ratewarden._adaptive",
        "ratewarden.kernel",  # the public face of the kernel, for the packages above
        "ratewarden",  # the face: what `import ratewarden` gives
    ),
    ("ratewarden.rules", "ratewarden.fleet"),
    ("ratewarden.envoy", "ratewarden.sim", "ratewarden.rlqs"),
    ("ratewarden.integrations", "ratewarden.otel"),
    ("ratewarden.server",),
    ("ratewarden.cli",),
    ("ratewarden.testing",),
)
# modules of the kernel's layers that may share a layer with each other
KERNEL = {name for layer in (LAYERS[0], LAYERS[3]) for name in layer}
# the only imports against the layers, each with its reason
UPWARD = {
    # envoy's names were public in ratewarden.rules before envoy had a package of
    # its own; they stay importable there, loaded on first use
    ("ratewarden.rules", "ratewarden.envoy"),
}


@dataclass(frozen=True)
class Import:
    importer: str
    target: str
    line: int
    at_load: bool  # runs when the importer is imported


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def package_of(name: str) -> str:
    return name if is_package(name) else name.rpartition(".")[0]


def _resolve(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = package_of(importer).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _walk(tree: ast.AST, at_load: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, at_load
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _walk(node, False)  # runs when called, not when loaded
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _walk(node, False)
        elif isinstance(node, ast.stmt | ast.excepthandler):
            yield from _walk(node, at_load)


def imports() -> list[Import]:
    found = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        for node, at_load in _walk(tree, True):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = _resolve(name, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in MODULES else base)
            else:
                targets = [alias.name for alias in node.names]
            found += [
                Import(name, t, node.lineno, at_load)
                for t in targets
                if t.split(".")[0] == "ratewarden"
            ]
    return found


IMPORTS = imports()


def layer_of(name: str) -> tuple[int, str]:
    best = (-1, "")
    for rank, layer in enumerate(LAYERS):
        for prefix in layer:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > len(best[1]):
                best = (rank, prefix)
    assert best[0] >= 0, f"{name} is on no layer: add it to LAYERS and docs/architecture.md"
    return best


def test_every_module_is_read() -> None:
    assert len(MODULES) > 50
    assert any(i.target == "ratewarden.stores.redis.connection" for i in IMPORTS)


def test_no_module_imports_another_packages_private_module() -> None:
    """A private module is its package's own: modules of that package import it,
    and not those of its subpackages (the root's private modules are the root's:
    a subpackage takes their names from `primitives` or `kernel`)."""
    wrong = []
    for i in IMPORTS:
        leaf = i.target.rpartition(".")[2]
        if leaf.startswith("_") and not leaf.startswith("__"):
            owner = package_of(i.target)
            inside = (i.importer + ".").startswith(owner + ".")
            if not inside or (owner == "ratewarden" and package_of(i.importer) != owner):
                wrong.append(f"{i.importer}:{i.line} imports {i.target}")
    assert not wrong, "\n".join(wrong)


def test_each_package_imports_only_from_the_layers_below() -> None:
    wrong = []
    for i in IMPORTS:
        (mine, my_prefix), (theirs, their_prefix) = layer_of(i.importer), layer_of(i.target)
        if mine > theirs or my_prefix == their_prefix:
            continue
        if mine == theirs and my_prefix in KERNEL and their_prefix in KERNEL:
            continue
        if (i.importer, i.target) in UPWARD and not i.at_load:
            continue
        wrong.append(f"{i.importer}:{i.line} imports {i.target} ({their_prefix} is not below)")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle_at_load() -> None:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for i in IMPORTS:
        if i.at_load and i.target in MODULES and i.target != i.importer:
            graph[i.importer].add(i.target)
    cycles = [c for c in _components(graph) if len(c) > 1]
    assert not cycles, "\n".join(" <-> ".join(sorted(c)) for c in cycles)


def test_no_import_cycle_even_among_type_only_imports() -> None:
    """A module that names another's types and is named by it is one job in two
    files, or wants a Protocol where it meets the other."""
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for i in IMPORTS:
        if i.target in MODULES and i.target != i.importer:
            graph[i.importer].add(i.target)
    cycles = [c for c in _components(graph) if len(c) > 1]
    assert not cycles, "\n".join(" <-> ".join(sorted(c)) for c in cycles)


def _components(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root, edges in graph.items():
        if root in index:
            continue
        work = [(root, iter(sorted(edges)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                found.append(component)
    return found


@pytest.mark.parametrize(
    "graph",
    [{"a": {"b"}, "b": {"c"}, "c": {"a"}}, {"a": {"a", "b"}, "b": {"a"}}],
)
def test_the_cycle_finder_finds_cycles(graph: dict[str, set[str]]) -> None:
    assert any(len(c) > 1 for c in _components(graph))


def test_the_cycle_finder_passes_a_tree() -> None:
    assert all(len(c) == 1 for c in _components({"a": {"b", "c"}, "b": {"c"}, "c": set()}))


def test_the_architecture_page_names_every_package() -> None:
    page = (SRC.parent / "docs" / "architecture.md").read_text()
    packages = [name for name in MODULES if is_package(name) and name != "ratewarden"]
    missing = [
        name
        for name in packages
        if f"`{name.removeprefix('ratewarden.').replace('.', '/')}/`" not in page
    ]
    assert not missing, f"docs/architecture.md's Layout does not name {missing}"
