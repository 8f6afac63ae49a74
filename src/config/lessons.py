"""Start-up check of a curriculum's lessons: every dependency names a known lesson, and the
dependencies form no cycle. Lessons are mappings ``{lesson_id: lesson}`` where each lesson has
``dependencies`` (a list of lesson ids, or of mappings/objects with a ``dependency_id``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from src.config.errors import ConfigError


def _dependency_ids(lesson: Any) -> list[str]:
    deps = (
        lesson.get("dependencies") if isinstance(lesson, Mapping) else getattr(lesson, "dependencies", None)
    )
    ids = []
    for dep in deps or []:
        if isinstance(dep, str):
            ids.append(dep)
        elif isinstance(dep, Mapping):
            ids.append(str(dep["dependency_id"]))
        else:
            ids.append(str(dep.dependency_id))
    return ids


def _find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """One dependency cycle as ``[a, b, ..., a]``, or None (depth-first, deterministic order)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


def validate_lessons(lessons: Mapping[str, Any], key: str = "curriculum.lessons") -> None:
    """Raise ``ConfigError`` naming unknown dependency ids and a dependency cycle, if any."""
    graph = {str(lid): _dependency_ids(lesson) for lid, lesson in lessons.items()}
    problems = [
        f"{key}.{lid}.dependencies: unknown lesson {dep!r} (known: {sorted(graph)})"
        for lid, deps in graph.items()
        for dep in deps
        if dep not in graph
    ]
    if problems:
        raise ConfigError(problems)
    cycle = _find_cycle(graph)
    if cycle:
        raise ConfigError([f"{key}: dependency cycle " + " -> ".join(cycle)])
