"""The layout's promise, checked: no import cycles in src/, layers import only downward, and the
pure packages (formats, rewards, algorithms) import neither Lightning nor the machinery."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[3] / "src"

# bottom-up: a package may import itself and any package listed before it
LAYERS = [
    "config",
    "formats",
    "algorithms",
    "rewards",
    "datamodules",
    "router",
    "envs",
    "rollout",
    "replay",
    "models",
    "callbacks",
    "jobs",
]
PURE = {"formats", "rewards", "algorithms"}
MAX_PACKAGE_SHARE = 0.25  # no package holds more than a quarter of src/ lines
PURE_FORBIDDEN = ("lightning", "pytorch_lightning", "src.rollout", "src.models", "src.callbacks", "src.jobs")


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at module level or inside functions, TYPE_CHECKING included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        graph[name] = {m for m in _imports(path) if m in files and m != name}
    return graph


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else None


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt) :] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_layers_import_only_downward():
    bad = []
    for module, deps in _graph().items():
        pkg = _package(module)
        if pkg is None:  # top-level helpers such as src.analysis sit above every layer
            continue
        assert pkg in LAYERS, f"{module}: package {pkg!r} has no place in LAYERS"
        for dep in deps:
            dep_pkg = _package(dep)
            if dep_pkg is not None and LAYERS.index(dep_pkg) > LAYERS.index(pkg):
                bad.append(f"{module} imports {dep} ({pkg} -> {dep_pkg})")
    assert not bad, "upward imports:\n" + "\n".join(sorted(bad))


@pytest.mark.parametrize("package", sorted(PURE))
def test_pure_packages_import_no_machinery(package):
    bad = []
    for path in (SRC / package).rglob("*.py"):
        for imported in _imports(path):
            if imported.startswith(PURE_FORBIDDEN):
                bad.append(f"{_module_name(path)} imports {imported}")
    assert not bad, "\n".join(sorted(bad))


def test_no_package_holds_more_than_a_quarter_of_src():
    lines: dict[str, int] = {}
    for path in SRC.rglob("*.py"):
        pkg = _package(_module_name(path)) or "(top level)"
        lines[pkg] = lines.get(pkg, 0) + len(path.read_text().splitlines())
    total = sum(lines.values())
    big = {pkg: round(n / total, 3) for pkg, n in lines.items() if n > MAX_PACKAGE_SHARE * total}
    assert not big, f"packages over {MAX_PACKAGE_SHARE:.0%} of src/ lines: {big}"
