"""No function in src/ takes more than 7 parameters (``self`` / ``cls`` not counted, ``*args`` and
``**kwargs`` counted once each): a longer list means the caller already holds a typed settings
object that should travel instead (e.g. ``SyntheticOptions``, ``LoaderSettings``, ``PPOClip``).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "src"
MAX_PARAMS = 7


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def long_signatures(root: Path, limit: int) -> set[str]:
    found = set()
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and parameter_count(node) > limit:
                found.add(f"{path.relative_to(root.parent).as_posix()} {node.name}")
    return found


def test_no_function_in_src_takes_more_than_7_parameters():
    assert sorted(long_signatures(SRC, MAX_PARAMS)) == [], "cut these down to a typed settings object"


def test_the_check_counts_parameters(tmp_path):
    pkg = tmp_path / "src"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "def f(a, b, c, d, e, f, g, h):\n    pass\n\n"
        "class C:\n    def m(self, a, b, c, d, e, f, g):\n        pass\n\n"
        "def k(a, *args, b, **kw):\n    pass\n"
    )
    assert long_signatures(pkg, MAX_PARAMS) == {"src/m.py f"}
    assert long_signatures(pkg, 3) == {"src/m.py f", "src/m.py m", "src/m.py k"}
