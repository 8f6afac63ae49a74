"""Server mode against a real OpenAI-compatible vLLM server (a subprocess on 127.0.0.1, a free port):
generation from token ids with the sampling log-probs, and weight sync through the shared directory
and vLLM's reload path. Runs in the vLLM venv (``make test-vllm``); one server for the module."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from enginechecks import assert_push_moves_greedy_like_hf

from src.config.sampling import SamplingParams
from src.rollout.engines.hf_decode import sampling_log_probs
from src.rollout.engines.vllm_engine import VLLMSettings, server_command
from src.rollout.factory import build_vllm_engine

pytest.importorskip("vllm", reason="vLLM not importable: run in the vLLM venv (make test-vllm)")
pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[3]
SETTINGS = dict(max_model_len=256, kv_cache_memory_gib=0.25, enforce_eager=True)
TEXTS = ["route me to the weather tool", "what is 2 + 2", "search the web for cats"]
START_TIMEOUT_S = 420


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM server exited ({proc.returncode}):\n{log_path.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"vLLM server not healthy after {START_TIMEOUT_S}s:\n{log_path.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("vllm_server")
    port = _free_port()
    argv = server_command(sys.executable, str(tiny_model_dir), VLLMSettings(**SETTINGS), "float32", port)
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": str(REPO)}
    log_path = work / "server.log"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(argv, env=env, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log_path)
        yield url, work / "sync"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_server_generates_like_hf_and_follows_weight_pushes(server, tiny_model_dir):
    from src.models.loading import load_causal_lm, load_tokenizer

    url, sync_dir = server
    model, tok = load_causal_lm(tiny_model_dir).eval(), load_tokenizer(tiny_model_dir)
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    engine = build_vllm_engine(
        model, tok, tiny_model_dir, mode="server", server_url=url, sync_dir=str(sync_dir), **SETTINGS
    )
    assert engine.needs_weight_sync and engine.pushes == 1  # the builder pushed the trainer's weights

    out = engine.generate(
        prompts, SamplingParams(n_generations_per_prompt=2, temperature=0.7, max_new_tokens=8)
    )
    assert out.response_ids.shape[0] == len(prompts) * 2 and out.response_mask.sum() > len(prompts) * 4
    for row, tokens in enumerate(out.token_lists()):
        prompt = prompts[row // 2]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + tokens])).logits[:, len(prompt) - 1 : -1]
        want = sampling_log_probs(logits, torch.tensor([tokens]), 0.7, 1.0)[0]
        assert torch.allclose(out.log_probs[row, : len(tokens)], want, atol=1e-5), row

    assert_push_moves_greedy_like_hf(engine, model, tok, prompts)
    assert engine.pushes == 2 and not list(sync_dir.glob(".policy.*"))  # atomic writes, no temp left
