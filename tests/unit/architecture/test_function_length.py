"""No function in src/ is longer than 60 lines (signature, docstring and body counted)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "src"
MAX_LINES = 60


def long_functions(root: Path, limit: int) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                length = node.end_lineno - start + 1
                if length > limit:
                    found.append(
                        f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({length} lines)"
                    )
    return found


def test_no_function_in_src_is_over_60_lines():
    assert long_functions(SRC, MAX_LINES) == []


def test_the_check_sees_a_long_function(tmp_path):
    pkg = tmp_path / "src"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (pkg / "m.py").write_text(f"def f():\n{body}\n\ndef g():\n    return 1\n")
    assert [s.split()[1] for s in long_functions(pkg, MAX_LINES)] == ["f"]
