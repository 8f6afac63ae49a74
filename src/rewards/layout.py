"""Linear-time matching of "literal, anything, literal, ..., literal" layouts.

ToolRL checks a response's tag layout with patterns such as
``^<think>.*?</think>\\n<tool_call>\\n.*?\\n</tool_call>$`` (``re.DOTALL``). A backtracking
engine tries every occurrence of each inner literal against every occurrence of the next one,
which is quadratic to cubic on degenerate text (``<think>`` then thousands of repeated
``</think>\\n<tool_call>\\n``): a 1 MB model output would stall a training step for minutes.

Such a pattern matches exactly when the text starts with the first literal, ends with the last
one (Python's ``$`` also accepts one trailing ``"\\n"``) and the inner literals occur in order,
without overlapping, in between. Taking the earliest occurrence of each inner literal is never
worse than a later one (every constraint after it is "starts at or after"), so one left-to-right
pass of ``str.find`` decides it: O(len(text)) for the fixed, short literals used here.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["matches_layout"]


def matches_layout(text: str, literals: Sequence[str]) -> bool:
    """Same answer as ``re.search("^" + ".*?".join(map(re.escape, literals)) + "$", text, re.DOTALL)``.

    Args:
        text: the string to test (any length).
        literals: at least two literal strings; ``.*?`` (any text, newlines included) sits
            between each consecutive pair.
    """
    if len(literals) < 2:
        raise ValueError(f"a layout needs at least two literals, got {len(literals)}")
    first, *inner, last = literals
    if not text.startswith(first):
        return False
    pos = len(first)
    for literal in inner:
        found = text.find(literal, pos)
        if found < 0:
            return False
        pos = found + len(literal)
    return _ends_with_at_or_after(text, last, pos)


def _ends_with_at_or_after(text: str, last: str, pos: int) -> bool:
    """Does ``last`` end the text (or precede its one final newline) starting at or after ``pos``?"""
    if text.endswith(last) and len(text) - len(last) >= pos:
        return True
    # ``$`` without MULTILINE also matches just before a newline that ends the string
    return text.endswith(last + "\n") and len(text) - len(last) - 1 >= pos
