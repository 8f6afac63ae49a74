"""API-Bank accuracy as ToolRL scores it (its ``benchmarks/API-Bank`` evaluation), as pure functions.

Reading a response: the text between the last ``<tool_call>`` and the next ``</tool_call>`` (the
whole response when the tags are missing), one JSON object per line; lines that are not JSON are
skipped. Scoring ("soft match"): the expected call is the item's ``answer`` (its first element
when it is a list); the response is correct when any of its calls has exactly the expected name
and exactly equal parameters. A call object without ``name`` / ``parameters`` keys is read as the
parameters of a call to the expected tool, as ToolRL does. Accuracy per level is correct / total.
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Mapping
from typing import Any

__all__ = ["api_bank_calls", "api_bank_correct", "expected_call"]


def api_bank_calls(response: str) -> list[Any]:
    """The JSON values on the lines of the response's (last) tool-call block; bad lines skipped.

    Never raises: a non-string response has no calls; a line nested too deep to parse is bad.
    """
    if not isinstance(response, str):
        return []
    # rpartition / partition, not split: a degenerate response repeats the tag thousands of times
    block = response.strip().rpartition("<tool_call>")[2].partition("</tool_call>")[0].strip()
    calls = []
    for line in block.split("\n"):
        if not line.strip():
            continue
        try:
            calls.append(json.loads(line))
        except (ValueError, RecursionError):
            continue
    return calls


def expected_call(answer: Any) -> Mapping[str, Any]:
    """The item's expected call: ``answer`` or its first element. Raises ValueError when it has no
    ``name`` and ``parameters``."""
    call = answer[0] if isinstance(answer, list) and answer else answer
    if not isinstance(call, Mapping) or "name" not in call or "parameters" not in call:
        # reprlib: bounded in depth and length, so a pathological answer cannot blow the stack
        raise ValueError(f"API-Bank answer is not a call with name and parameters: {reprlib.repr(answer)}")
    return call


def api_bank_correct(calls: list[Any], answer: Any) -> bool:
    """ToolRL's soft match: some call has the expected name and exactly the expected parameters.

    As in ToolRL, checking stops (incorrect) at the first call that cannot be read as a call: a
    string that is not JSON, or a scalar.
    """
    want = expected_call(answer)
    try:
        return _soft_match(calls, want)
    except RecursionError:  # a call nested too deep to compare is not the expected one
        return False


def _soft_match(calls: list[Any], want: Mapping[str, Any]) -> bool:
    for call in calls:
        if isinstance(call, str):
            try:
                call = json.loads(call)
            except ValueError:
                return False
        if not isinstance(call, (Mapping, list, str)):
            return False  # ToolRL's membership test raises here and ends the loop
        if isinstance(call, Mapping) and "name" in call and "parameters" in call:
            name, params = call["name"], call["parameters"]
        else:
            name, params = want["name"], call
        if name == want["name"] and params == want["parameters"]:
            return True
    return False
