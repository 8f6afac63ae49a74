"""API-Bank with ToolRL's metric: the scorer against hand cases, and scripts/evaluate.py end to end on
the tiny model over a small subset of the real files (skipped without ../shared/data)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from jobhelpers import REPO

from src.rewards.api_bank import api_bank_calls, api_bank_correct

ANSWER = [{"name": "QueryMeeting", "parameters": {"user_name": "John"}}]


def _resp(*lines: str) -> str:
    return "<think> x </think>\n<tool_call>\n" + "\n".join(lines) + "\n</tool_call>"


@pytest.mark.parametrize(
    ("response", "correct"),
    [
        (_resp('{"name": "QueryMeeting", "parameters": {"user_name": "John"}}'), True),
        (_resp('{"name": "QueryMeeting", "parameters": {"user_name": "john"}}'), False),
        (
            _resp(
                '{"name": "Other", "parameters": {}}',
                '{"name": "QueryMeeting", "parameters": {"user_name": "John"}}',
            ),
            True,
        ),
        (
            _resp("not json", '{"name": "QueryMeeting", "parameters": {"user_name": "John"}}'),
            True,
        ),  # bad lines skipped
        (_resp('{"user_name": "John"}'), True),  # bare parameters are read as a call of the expected tool
        (
            _resp("5", '{"name": "QueryMeeting", "parameters": {"user_name": "John"}}'),
            False,
        ),  # ToolRL stops at a scalar
        ("<think> x </think>\n<response> hi </response>", False),
        ('{"name": "QueryMeeting", "parameters": {"user_name": "John"}}', True),  # no tags: the whole text
    ],
)
def test_toolrl_soft_match(response, correct):
    assert api_bank_correct(api_bank_calls(response), ANSWER) is correct
    assert api_bank_correct(api_bank_calls(response), ANSWER[0]) is correct  # a dict answer too


def test_bad_item_names_file_and_row(tmp_path):
    from src.jobs.api_bank import load_api_bank

    (tmp_path / "level-1-api_processed.json").write_text(
        json.dumps([{"system": "s", "user": "u", "answer": "x"}])
    )
    with pytest.raises(ValueError, match=r"level-1-api_processed.json, row 0"):
        load_api_bank(tmp_path, [1])
    with pytest.raises(FileNotFoundError, match="level 2"):
        load_api_bank(tmp_path, [2])


def test_evaluate_api_bank_on_the_tiny_model(shared_data, tiny_model_dir, tmp_path):
    out = tmp_path / "api_bank"
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/evaluate.py",
            "--model",
            str(tiny_model_dir),
            "--api-bank",
            str(shared_data / "api_bank"),
            "--limit",
            "2",
            "--max-new-tokens",
            "8",
            "--out-dir",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for level in ("level 1", "level 2", "level 3", "overall"):
        assert f"| {level} |" in proc.stdout
    import pandas as pd

    table = pd.read_csv(out / "api_bank_levels.csv")
    assert table["total"].tolist() == [2, 2, 2, 6]
    assert ((table["accuracy"] >= 0) & (table["accuracy"] <= 100)).all()
    assert len((out / "api_bank_rows.jsonl").read_text().splitlines()) == 6
