"""vLLM engines against a fake ``vllm`` module (calls recorded) and a fake OpenAI-compatible server:
the order of sleep / wake / push / reset and what crosses the wire. The same engines against a real
vLLM: tests/e2e/real_vllm (the vLLM venv, ``make test-vllm``)."""

import json
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from omegaconf import OmegaConf

from src.config.sampling import SamplingParams
from src.rollout.engines.vllm_engine import VLLMSettings, lora_scaling_of, merged_weights, require_vllm
from src.rollout.factory import check_engine_available, make_engine


# ------------------------------------------------------------------------------------------ fake vllm
class _Logprob:
    def __init__(self, logprob):
        self.logprob = logprob


def _fake_vllm(calls: list):
    mod = types.ModuleType("vllm")

    class SamplingParams:
        def __init__(self, **kw):
            self.kw = kw

    class LLM:
        def __init__(self, **kw):
            calls.append(("init", kw))

        def sleep(self, level):
            calls.append(("sleep", level))

        def wake_up(self, tags=None):
            calls.append(("wake_up", tuple(tags or ())))

        def reset_prefix_cache(self):
            calls.append(("reset_prefix_cache",))

        def collective_rpc(self, method, args=()):
            from safetensors.torch import load

            if method == "set_idle_spin":  # the worker's idle busy-poll, set once at start
                calls.append(("set_idle_spin", args[0]))
                return [1]

            assert isinstance(args[0], bytes)  # msgpack would turn tensors into lists
            calls.append(("collective_rpc", method, load(args[0])))

        def generate(self, prompts, params, use_tqdm=False):
            calls.append(("generate", len(prompts), params.kw))
            outs = []
            for p in prompts:
                comps = [
                    types.SimpleNamespace(
                        index=j,
                        token_ids=[p["prompt_token_ids"][-1], 7 + j],
                        logprobs=[{p["prompt_token_ids"][-1]: _Logprob(-0.5)}, {7 + j: _Logprob(-1.5)}],
                    )
                    for j in reversed(range(params.kw["n"]))  # out of order on purpose
                ]
                outs.append(types.SimpleNamespace(outputs=comps))
            return outs

    mod.LLM, mod.SamplingParams = LLM, SamplingParams
    return mod


def _install_fake_vllm(monkeypatch, calls: list, sleep_supported: bool = True):
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_sleep_mode_available=lambda: sleep_supported)
    monkeypatch.setitem(sys.modules, "vllm", _fake_vllm(calls))
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)


def _rollout_cfg(**vllm):
    base = OmegaConf.load("configs/rollout/hf.yaml")
    base.engine = "vllm"
    base.engines.vllm = OmegaConf.merge(base.engines.vllm, vllm)
    return base


class _Tok:
    pad_token_id = 0
    eos_token_id = 2


def test_rollout_vllm_without_vllm_fails_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(ImportError, match=r'pip install -e "\.\[vllm\]"'):
        require_vllm()
    with pytest.raises(ImportError, match=r"\[vllm\]"):
        check_engine_available(_rollout_cfg())
    with pytest.raises(ValueError, match="rollout.engines.vllm.mode"):
        check_engine_available(_rollout_cfg(mode="remote"))
    with pytest.raises(ValueError, match="rollout.engine"):
        check_engine_available(OmegaConf.create({"engine": "sglang", "engines": {}}))


def test_colocated_engine_sleeps_wakes_pushes_and_resets_in_order(monkeypatch, tiny):
    model, _ = tiny
    calls: list = []
    _install_fake_vllm(monkeypatch, calls)
    engine = make_engine(_rollout_cfg(), _Tok(), model, "/models/x")
    init = calls[0][1]
    assert init["enable_sleep_mode"] and init["logprobs_mode"] == "processed_logprobs"
    assert init["dtype"] == "float32"  # the trainer's
    assert init["worker_extension_cls"] == "src.rollout.engines.vllm_engine.WeightSyncExtension"
    # built asleep, then the trainer's current weights pushed (a resumed run's checkpoint)
    assert [c[0] for c in calls[1:]] == [
        "set_idle_spin", "sleep", "wake_up", "collective_rpc", "reset_prefix_cache"
    ]  # fmt: skip
    assert calls[1] == ("set_idle_spin", 0.05) and calls[3] == ("wake_up", ("weights",))
    pushed = calls[4][2]
    assert set(pushed) == set(model.state_dict()) and torch.equal(
        pushed["model.embed_tokens.weight"], model.state_dict()["model.embed_tokens.weight"]
    )
    calls.clear()
    out = engine.generate(
        [[5, 6], [9]], SamplingParams(n_generations_per_prompt=2, temperature=1.0, max_new_tokens=4)
    )
    assert [c[0] for c in calls] == ["wake_up", "generate", "sleep"]
    assert calls[0] == ("wake_up", ("kv_cache",))  # the weights are already awake after the push
    assert calls[1][2]["logprobs"] == 0 and calls[1][2]["max_tokens"] == 4
    assert out.token_lists() == [[6, 7], [6, 8], [9, 7], [9, 8]]
    assert out.log_probs[:, :2].tolist() == [[-0.5, -1.5]] * 4
    calls.clear()
    engine.update_weights({k: v + 1 for k, v in model.state_dict().items()})
    assert [c[0] for c in calls] == ["wake_up", "collective_rpc", "reset_prefix_cache"]


def test_lora_weights_are_merged_and_unprefixed_like_peft_merge(tiny_model_dir):
    from src.models.loading import LoraSettings, load_causal_lm

    lora = load_causal_lm(tiny_model_dir, lora=LoraSettings(enable=True, r=4, alpha=8))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)  # B starts at 0: make the adapter do something
    merged = merged_weights(lora.state_dict(), lora_scaling_of(lora))
    reference = lora.merge_and_unload().state_dict()
    assert set(merged) == set(reference)
    assert not any("lora" in k or "base_layer" in k or k.startswith("base_model") for k in merged)
    for k, v in reference.items():
        assert torch.allclose(merged[k], v, atol=1e-6), k
    with pytest.raises(ValueError, match="lora_scaling"):
        merged_weights({"base_model.model.a.lora_A.default.weight": torch.zeros(1)}, None)


def test_colocated_engine_pushes_merged_lora_names(monkeypatch, tiny_model_dir):
    from src.models.loading import LoraSettings, load_causal_lm

    calls: list = []
    _install_fake_vllm(monkeypatch, calls)
    lora = load_causal_lm(tiny_model_dir, lora=LoraSettings(enable=True, r=4, alpha=8))
    make_engine(_rollout_cfg(), _Tok(), lora, "/models/x")
    pushed = next(c[2] for c in calls if c[0] == "collective_rpc")
    assert "model.layers.0.self_attn.q_proj.weight" in pushed
    assert not any("lora" in k or "base_layer" in k or k.startswith("base_model") for k in pushed)


# ------------------------------------------------------------------------------------------ server mode
class _FakeServer(BaseHTTPRequestHandler):
    log: list = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        self.log.append((self.path, body))
        reply = {}
        if self.path == "/v1/completions":
            choices = []
            for i, prompt in enumerate(body["prompt"]):
                for j in range(body["n"]):
                    toks = [prompt[-1], 40 + j]
                    choices.append(
                        {
                            "index": i * body["n"] + j,
                            "logprobs": {
                                "tokens": [f"token_id:{t}" for t in toks],
                                "token_logprobs": [-0.25, -2.0],
                            },
                        }
                    )
            reply = {"choices": list(reversed(choices))}
        payload = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_server():
    _FakeServer.log = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _FakeServer.log
    server.shutdown()


def test_server_engine_generates_from_token_ids_and_syncs_through_the_shared_dir(
    monkeypatch, tiny, tmp_path, fake_server
):
    from safetensors.torch import load_file

    url, log = fake_server
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))  # the trainer side needs no vLLM
    model, _ = tiny
    engine = make_engine(
        _rollout_cfg(mode="server", server_url=url, sync_dir=str(tmp_path)), _Tok(), model, "m"
    )
    assert [p for p, _ in log] == ["/collective_rpc", "/reset_prefix_cache"]  # start / resume push
    rpc = log[0][1]
    assert rpc["method"] == "load_weights_from_file"
    on_disk = load_file(rpc["args"][0])
    assert set(on_disk) == set(model.state_dict())
    assert not list(tmp_path.glob(".policy.*"))  # atomic write: no temp file left
    log.clear()
    out = engine.generate(
        [[5, 6], [9]], SamplingParams(n_generations_per_prompt=2, temperature=1.0, max_new_tokens=3)
    )
    path, body = log[0]
    assert (
        path == "/v1/completions" and body["prompt"] == [[5, 6], [9]] and body["return_tokens_as_token_ids"]
    )
    assert body["logprobs"] == 0 and body["max_tokens"] == 3
    assert out.token_lists() == [[6, 40], [6, 41], [9, 40], [9, 41]]
    assert out.log_probs[0, :2].tolist() == [-0.25, -2.0]
    log.clear()
    engine.update_weights(model.state_dict())
    assert [p for p, _ in log] == ["/collective_rpc", "/reset_prefix_cache"]


def test_server_mode_needs_a_sync_dir():
    with pytest.raises(ValueError, match="rollout.engines.vllm.sync_dir"):
        VLLMSettings(mode="server")


def test_colocated_engine_without_sleep_mode_stays_awake(monkeypatch, tiny, caplog):
    model, _ = tiny
    calls: list = []
    _install_fake_vllm(monkeypatch, calls, sleep_supported=False)
    with caplog.at_level("INFO", logger="src.rollout.engines.vllm_engine"):
        engine = make_engine(_rollout_cfg(), _Tok(), model, "/models/x")
    assert not calls[0][1]["enable_sleep_mode"] and not engine.sleeps
    assert sum("sleep mode is not supported" in r.message for r in caplog.records) == 1
    engine.generate([[5]], SamplingParams(n_generations_per_prompt=1, max_new_tokens=2))
    engine.update_weights(model.state_dict())
    assert "sleep" not in [c[0] for c in calls] and "wake_up" not in [c[0] for c in calls]
    assert [c[0] for c in calls][-2:] == ["collective_rpc", "reset_prefix_cache"]


def test_only_engines_holding_a_weight_copy_need_a_sync(monkeypatch, tiny, tmp_path, fake_server):
    from src.rollout.factory import build_hf_engine

    model, tok = tiny
    hf = build_hf_engine(model, tok)
    assert hf.needs_weight_sync is False
    hf.sleep(), hf.wake()  # no-ops: the trainer's own module
    _install_fake_vllm(monkeypatch, [])
    assert make_engine(_rollout_cfg(), _Tok(), model, "/models/x").needs_weight_sync is True
    url, _ = fake_server
    server = make_engine(
        _rollout_cfg(mode="server", server_url=url, sync_dir=str(tmp_path)), _Tok(), model, "m"
    )
    assert server.needs_weight_sync is True
