"""scripts/label_tools.py as a real subprocess: real parquet, local OpenAI-format servers."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from src.formats.tools_block import tool_descriptions
from src.router.families import FAMILIES, ToolFamilies, label_tool
from src.router.routes import weak_label

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "label_tools.py"
DATA = REPO / ".." / "shared" / "data"
TEST_PARQUET = DATA / "rlla_4k" / "test.parquet"

pd = pytest.importorskip("pandas")


def _load_script_module():
    spec = importlib.util.spec_from_file_location("label_tools_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCRIPT_MODULE = _load_script_module()


def run_script(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_main(capsys, *args: str) -> dict:
    """The script's main() in this process (cheaper than a subprocess); returns its summary."""
    assert SCRIPT_MODULE.main(list(args)) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def summary_of(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def real_df():
    if not TEST_PARQUET.exists():
        pytest.skip("real data absent")
    return pd.read_parquet(TEST_PARQUET)


@pytest.fixture
def small_parquet(real_df, tmp_path) -> Path:
    path = tmp_path / "small.parquet"
    real_df.head(4).to_parquet(path)
    return path


def _tools_of(df) -> dict[str, str]:
    tools: dict[str, str] = {}
    for prompt in df["prompt"]:
        for name, desc in tool_descriptions(prompt[0]["content"]).items():
            tools.setdefault(name, desc)
    return tools


@contextmanager
def chat_server(answer: Callable[[dict], tuple[int, str]]) -> Iterator[tuple[str, list[dict]]]:
    """A local OpenAI-style /v1/chat/completions server; yields (base URL, requests seen)."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, **body})
            status, content = answer(body)
            payload = (
                json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})
                if status == 200
                else json.dumps({"error": content})
            ).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):  # keep test output quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_heuristic_run_on_real_parquet(real_df, tmp_path, capsys):
    side, labels_pq, labels_csv = tmp_path / "side.json", tmp_path / "labels.parquet", tmp_path / "labels.csv"
    summary = summary_of(run_script(str(TEST_PARQUET), "--out", str(side), "--labels-out", str(labels_pq)))
    run_main(capsys, str(TEST_PARQUET), "--labels-out", str(labels_csv))
    sidecar = json.loads(side.read_text())
    tools = _tools_of(real_df)
    assert set(sidecar) == set(tools) and len(sidecar) == 259 == summary["tools"]
    assert sidecar == {name: label_tool(name, desc) for name, desc in tools.items()}
    assert summary["rows"] == 80 and summary["heuristic"] == 259

    labels = pd.read_parquet(labels_pq)
    assert list(labels.columns) == ["uid", "router_target_action"]
    assert labels["uid"].tolist() == [e["index"] for e in real_df["extra_info"]]
    fam = ToolFamilies.from_file(side)  # the sidecar reads back
    expected = [
        weak_label(rm["ground_truth"], fam, descriptions=tool_descriptions(p[0]["content"]))
        for p, rm in zip(real_df["prompt"], real_df["reward_model"])
    ]
    assert labels["router_target_action"].tolist() == expected
    assert set(expected) == {"ANSWER", "SEARCH", "CALCULATE", "MIXED"}
    assert summary["labels"] == labels["router_target_action"].value_counts().to_dict()

    assert pd.read_csv(labels_csv).equals(labels)


def test_endpoint_answers_are_used(small_parquet, tmp_path):
    side = tmp_path / "side.json"
    with chat_server(lambda body: (200, "<think>hmm</think> Calculate.")) as (url, seen):
        summary = summary_of(
            run_script(
                str(small_parquet),
                "--out",
                str(side),
                "--endpoint",
                url + "/v1",
                "--model",
                "tiny",
                "--timeout",
                "5",
            )
        )
    sidecar = json.loads(side.read_text())
    assert sidecar and set(sidecar.values()) == {"calculate"}
    assert summary["llm_answered"] == len(sidecar) == len(seen)
    assert all(r["path"] == "/v1/chat/completions" and r["model"] == "tiny" for r in seen)
    asked = {r["messages"][0]["content"].split("Tool name: ")[1].split("\n")[0] for r in seen}
    assert asked == set(sidecar)


def test_endpoint_errors_fall_back_to_heuristic(small_parquet, real_df, tmp_path, capsys):
    side = tmp_path / "side.json"
    with chat_server(lambda body: (500, "boom")) as (url, seen):
        summary = run_main(capsys, str(small_parquet), "--out", str(side), "--endpoint", url, "--model", "m")
    tools = _tools_of(real_df.head(4))
    assert json.loads(side.read_text()) == {n: label_tool(n, d) for n, d in tools.items()}
    assert summary["llm_errors"] == 3 == len(seen)  # gave up after three failures in a row
    assert summary["llm_skipped"] == len(tools) - 3 and summary["heuristic"] == len(tools)


def test_endpoint_unparseable_answers_fall_back(small_parquet, real_df, tmp_path, capsys):
    side = tmp_path / "side.json"
    with chat_server(lambda body: (200, "search or other, hard to say")) as (url, _):
        summary = run_main(capsys, str(small_parquet), "--out", str(side), "--endpoint", url, "--model", "m")
    tools = _tools_of(real_df.head(4))
    assert json.loads(side.read_text()) == {n: label_tool(n, d) for n, d in tools.items()}
    assert summary["llm_unparseable"] == len(tools)


def test_endpoint_down_and_bad_arguments(small_parquet, tmp_path, capsys):
    # nothing listens on port 9 of localhost: connection refused -> heuristic
    summary = run_main(
        capsys, str(small_parquet), "--endpoint", "http://127.0.0.1:9", "--model", "m", "--timeout", "2"
    )
    assert summary["llm_errors"] == 3
    for args, message in [
        (["--endpoint", "http://127.0.0.1:9"], "--endpoint needs --model"),
        (["--labels-out", str(tmp_path / "x.txt")], "must end in .parquet or .csv"),
    ]:
        with pytest.raises(SystemExit) as exc:
            SCRIPT_MODULE.main([str(small_parquet), *args])
        assert exc.value.code == 2 and message in capsys.readouterr().err
    bad = run_script(str(tmp_path / "missing.parquet"))
    assert bad.returncode == 2 and "no such parquet file" in bad.stderr


def test_malformed_rows_are_counted(real_df, tmp_path, capsys):
    df = real_df.head(3).copy()
    df.at[1, "reward_model"] = {
        "ground_truth": '<think> t </think>\n<tool_call>\n{"name": \n</tool_call>',
        "style": "rule",
    }
    path = tmp_path / "bad.parquet"
    df.to_parquet(path)
    out = tmp_path / "labels.csv"
    summary = run_main(capsys, str(path), "--labels-out", str(out))
    assert summary["ground_truths_with_unreadable_calls"] == 1
    assert pd.read_csv(out)["router_target_action"].tolist()[1] == "MIXED"


def test_answer_parsing_and_urls():
    mod = SCRIPT_MODULE
    assert mod.parse_family_answer("Search") == "search"
    assert mod.parse_family_answer("calculation.") == "calculate"
    assert mod.parse_family_answer("<think>search? other?</think>\nother") == "other"
    assert mod.parse_family_answer("search or calculate") is None
    assert mod.parse_family_answer("") is None and mod.parse_family_answer(None) is None
    assert mod.chat_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert mod.chat_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert mod.chat_url("http://h:1/v1/chat/completions") == "http://h:1/v1/chat/completions"
    assert set(FAMILIES) == {"search", "calculate", "other"}
