"""A lean decode step for the Llama / Qwen2 family (``rollout.engines.hf.decode: lean``).

On a small model on CPU one decode token through the HF forward spends much of its time in
attention that reads every row's copy of the prompt's keys and values although the G samples of a
prompt share them, and in many small ops (mask creation, cache updates, RoPE and RMSNorm pieces)
besides the linears (docs/benchmarks.md has the profile). This step computes the same function
with plain tensor ops on the module's own parameters, read when the step is built (once per
generate call, so weight updates between calls are live):

- q / k / v run as one product and gate / up as one (their weights concatenated once per call);
- on CPU in fp32 every product runs through oneDNN on weights reordered once per call into its
  blocked layout (``torch.ops.mkldnn``, the kernels inductor's CPU linears use). A decode step
  reads every weight once and the model's ~25 MB do not stay in cache between steps, so each
  product streams its weight from memory; oneDNN's kernels stream it faster than MKL's sgemm at
  a decode step's few rows (docs/benchmarks.md), and give the [rows, out] result directly;
- elsewhere (CUDA, other dtypes, no oneDNN) every product runs as W [out, in] @ x^T on the
  module's own weight, an [out, rows] result read through its transpose: at a decode step's few
  rows with MKL this orientation runs faster than x @ W^T (``F.linear``; docs/benchmarks.md); the
  LM head's [V, rows] logits are copied once, into the [rows, V] rows the sampler reads;
- the prompt's keys / values stay as the prefill wrote them, once per prompt ([P, kv, W, d]); the
  G samples' queries attend to them as one batch (G times less cache read per step), and to their
  own generated keys / values ([P, kv, G, T, d], written in place, one slot per step); one softmax
  over both parts, so the result is the full attention's;
- the prompt padding is an additive bias built once per generate call; RoPE cos / sin of every
  decode position come from the model's own rotary embedding, once per generate call;
- the LM head runs on the one new position.

With ``fixed_shape`` the step's shapes do not depend on the slot j (a 0-dim device tensor then):
each row attends to all T_max of its own slots with those after j masked, and slot j is written by
``index_copy_``. It does more work than the sliced step (T_max own slots instead of j + 1), but one
CUDA graph of it replays every step (``GraphedStep``), which is what a GPU needs: there a decode
token is a long run of small kernel launches, far more time than their arithmetic.

It supports exactly what :func:`unsupported_reason` checks; anything else decodes through the HF
forward (``hf_decode``), with the reason logged once.

**One CUDA graph per generate call** (``rollout.engines.hf.cuda_graph``; ``GraphedStep``). On a GPU
an eager decode step of a mid-sized model is bound by kernel launches, not arithmetic: each layer
issues tens of small kernels per token, each a few microseconds of Python and driver work, while
the step's bytes (its weights once) move in a fraction of that. Capturing the fixed-shape lean step
(``LeanStep(fixed_shape=True)``) once per generate call and replaying it each step removes that
cost (docs/benchmarks.md, "GPU"). The sampler stays eager (a handful of kernels on [rows, V]).

**Compiled, with the sampler** (``rollout.engines.hf.lean_compile``, off by default; ``compiled``).
The captured step still runs ~1,000 small kernels per token (RMSNorm, RoPE, SiLU * up, residual
adds, each its own); ``torch.compile`` of the fixed-shape step fuses those chains. The compiled
function is ``hf_decode.SampledStep``: the step and the sampler (temperature, top-p, the
inverse-CDF pick from uniforms drawn outside, the token's log-prob), so on CUDA one graph holds
both. On CPU the compiled step runs each token without a graph.

The graph reads its inputs from two static buffers (the step's tokens and the slot j) and writes
its logits to one static output, overwritten by the next replay: the decode loop reads each step's
logits before it asks for the next.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
_logged: set[str] = set()


def _plain_linears(model) -> bool:
    """Every projection and the LM head a plain ``nn.Linear`` (not a LoRA, quantised or hooked one)."""
    body = model.model
    modules = [model.lm_head]
    for layer in body.layers:
        modules += [getattr(layer.self_attn, p) for p in _PROJECTIONS] + [getattr(layer.mlp, p) for p in _MLP]
    return all(type(m) is torch.nn.Linear for m in modules) and type(body.embed_tokens) is torch.nn.Embedding


def unsupported_reason(model) -> str | None:
    """Why the lean step cannot run ``model`` (None: it can)."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    if hasattr(model, "peft_config"):
        return "a peft (LoRA) model"
    if not hasattr(model, "model") or not hasattr(model.model, "layers") or not hasattr(model, "lm_head"):
        return f"{type(model).__name__} has no .model.layers / .lm_head"
    if getattr(config, "use_sliding_window", False) or any(
        t != "full_attention" for t in (getattr(config, "layer_types", None) or [])
    ):
        return "sliding-window attention"
    rope_type = getattr(getattr(model.model, "rotary_emb", None), "rope_type", None)
    if rope_type != "default":
        return f"rope_type {rope_type!r} (only 'default')"
    if config.hidden_act != "silu" or getattr(config, "pretraining_tp", 1) != 1:
        return f"hidden_act {config.hidden_act!r} / pretraining_tp (only silu, 1)"
    if not _plain_linears(model):
        return "a projection that is not a plain nn.Linear (LoRA, quantised, wrapped)"
    if _hooked(model):
        return "forward hooks on the decoder's modules (the lean step would bypass them)"
    return None


# transformers installs these on every decoder layer at a model's first forward with
# output_hidden_states / output_attentions, for good; they record nothing unless such a forward is
# running (the router's hidden-state pass is one), and the lean step never runs one
_INERT_HOOK_MODULES = ("transformers.utils.output_capturing",)


def _hooked(model) -> bool:
    modules = [*model.model.modules(), model.lm_head]
    hooks = [h for m in modules for h in (*m._forward_hooks.values(), *m._forward_pre_hooks.values())]
    return any(getattr(h, "__module__", None) not in _INERT_HOOK_MODULES for h in hooks)


def log_fallback_once(reason: str) -> None:
    if reason not in _logged:
        _logged.add(reason)
        log.info("rollout.engines.hf.decode=lean: decoding through the HF forward instead: %s", reason)


def _rms_norm(norm, x: torch.Tensor) -> torch.Tensor:
    """The HF RMSNorm (Llama / Qwen2): normalised in fp32, cast back, then scaled (one fused op in fp32)."""
    if x.dtype == torch.float32 and norm.weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)
    y = F.rms_norm(x.float(), (x.shape[-1],), eps=norm.variance_epsilon)
    return norm.weight * y.to(x.dtype)


def onednn_products(weight: torch.Tensor) -> bool:
    """Whether the decode step's products run through oneDNN for parameters like ``weight``: on
    CPU, in fp32 and not under autocast (its kernels take fp32 inputs alone), where PyTorch was
    built with it (module docstring)."""
    on_cpu_fp32 = (
        weight.device.type == "cpu" and weight.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
    )
    return (
        on_cpu_fp32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


class _Linear:
    """``x [rows, in] -> [rows, out]`` of one or more linears that read the same input, their
    weights concatenated (one product), laid out once per generate call (module docstring)."""

    def __init__(self, *modules, rows: int, onednn: bool):
        weight = modules[0].weight if len(modules) == 1 else torch.cat([m.weight for m in modules], dim=0)
        bias = None
        if any(m.bias is not None for m in modules):
            bias = torch.cat(
                [m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in modules]
            )
        self.onednn = onednn
        if onednn:  # oneDNN's blocked copy of W, its kernel picked for `rows` rows
            self.weight, self.bias = torch.ops.mkldnn._reorder_linear_weight(weight, rows), bias
        else:
            self.weight, self.bias = weight, None if bias is None else bias[:, None]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.onednn:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        # W [out, in] @ x^T, a view of an [out, rows] product (module docstring)
        out = self.weight @ x.t() if self.bias is None else torch.addmm(self.bias, self.weight, x.t())
        return out.t()


class _LayerWeights:
    """One decoder layer's products, laid out for the decode step (see the module docstring)."""

    def __init__(self, layer, rows: int, onednn: bool):
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv = _Linear(attn.q_proj, attn.k_proj, attn.v_proj, rows=rows, onednn=onednn)
        self.split = (attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features)
        self.o = _Linear(attn.o_proj, rows=rows, onednn=onednn)
        self.gate_up = _Linear(mlp.gate_proj, mlp.up_proj, rows=rows, onednn=onednn)
        self.inter = mlp.gate_proj.out_features
        self.down = _Linear(mlp.down_proj, rows=rows, onednn=onednn)
        self.attn = attn
        self.input_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm


def _rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """HF's ``x * cos + rotate_half(x) * sin`` with rotate_half's sign folded into the sine table."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin


class LeanStep:
    """``step(tokens [P*n], j) -> logits [P*n, V]``: one decode token per row at generated slot j.

    Built once per generate call from the prefill's cache (``cache.layers[i].keys / values``,
    [P, kv, W, d], RoPE applied), the prompts' mask [P, W] and the group size n; rows are
    prompt-major (row = prompt * n + sample). ``fixed_shape``: j is a 0-dim long tensor on the
    device and no shape depends on it (module docstring).
    """

    def __init__(self, model, cache, attn: torch.Tensor, n: int, t_max: int, fixed_shape: bool = False):
        body = model.model
        self.model, self.n, self.fixed_shape = model, n, fixed_shape
        # keys stored transposed ([P, kv, d, W], once per call): the per-step product with the few
        # queries of a group runs ~2x faster on a contiguous K^T than on a transposed view
        self.prompt_kv = [(layer.keys.transpose(-1, -2).contiguous(), layer.values) for layer in cache.layers]
        p, kv_heads, head_dim, _ = self.prompt_kv[0][0].shape
        self.rep = model.config.num_attention_heads // kv_heads
        keys = self.prompt_kv[0][0]
        # the fixed-shape step reads slots not yet written (masked): they must hold finite values,
        # as 0 * NaN of uninitialised memory would not vanish
        new = keys.new_zeros if fixed_shape else keys.new_empty
        self.gen_kv = [
            (new((p, kv_heads, n, t_max, head_dim)), new((p, kv_heads, n, t_max, head_dim)))
            for _ in body.layers
        ]
        bias = torch.zeros(attn.shape, dtype=keys.dtype, device=keys.device).masked_fill_(
            attn == 0, float("-inf")
        )
        self.bias = bias[:, None, None, None, :]  # [P, 1, 1, 1, W]
        position = attn.sum(-1).repeat_interleave(n)[:, None] + torch.arange(t_max, device=attn.device)
        # the fixed-shape step is the CUDA graph's, whose products stay plain tensor ops
        onednn = not fixed_shape and onednn_products(model.lm_head.weight)
        self.layers = [_LayerWeights(layer, p * n, onednn) for layer in body.layers]
        self.head = _Linear(model.lm_head, rows=p * n, onednn=onednn)
        cos, sin = body.rotary_emb(keys, position)  # [P*n, T, d]
        half = sin.shape[-1] // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        self.cos, self.sin = cos.transpose(0, 1)[:, :, None], sin.transpose(0, 1)[:, :, None]

    def __call__(self, tokens: torch.Tensor, j: int | torch.Tensor) -> torch.Tensor:
        body = self.model.model
        slot = _Slot.fixed(j, self) if self.fixed_shape else _Slot.sliced(j, self)
        h = F.embedding(tokens, body.embed_tokens.weight)
        for layer, prompt, gen in zip(self.layers, self.prompt_kv, self.gen_kv):
            h = h + self._attention(layer, _rms_norm(layer.input_norm, h), prompt, gen, slot)
            gate, up = layer.gate_up(_rms_norm(layer.post_norm, h)).split(layer.inter, dim=-1)
            h = h + layer.down(F.silu(gate) * up)
        # the sampler reads [rows, V] rows: oneDNN's result is one, W_head @ x^T a transposed view
        return self.head(_rms_norm(body.norm, h)).contiguous()

    def _attention(self, layer: _LayerWeights, x, prompt, gen, slot: _Slot) -> torch.Tensor:
        (pk_t, pv), (gk, gv) = prompt, gen
        p, kv_heads, d, width = pk_t.shape
        rows, n, rep = x.shape[0], self.n, self.rep
        q, k, v = layer.qkv(x).split(layer.split, dim=-1)
        q = _rope(q.reshape(rows, -1, d), slot.cos, slot.sin) * layer.attn.scaling
        k = _rope(k.reshape(rows, kv_heads, d), slot.cos, slot.sin)
        # grouped layout [P, kv, n, ...]: query head h reads kv head h // rep (HF's repeat_kv)
        own_k = slot.write(gk, k.view(p, n, kv_heads, d).transpose(1, 2))
        own_v = slot.write(gv, v.reshape(p, n, kv_heads, d).transpose(1, 2))
        qg = q.view(p, n, kv_heads, rep, d).transpose(1, 2)  # [P, kv, n, rep, d]
        on_prompt = torch.matmul(qg.reshape(p, kv_heads, n * rep, d), pk_t)
        on_own = torch.matmul(qg, own_k.transpose(-1, -2))
        scores = torch.cat(
            (
                on_prompt.view(p, kv_heads, n, rep, width) + self.bias,
                on_own if slot.own_bias is None else on_own + slot.own_bias,
            ),
            dim=-1,
        )
        probs = scores.softmax(-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs[..., :width].reshape(p, kv_heads, n * rep, width), pv).view(
            p, kv_heads, n, rep, d
        )
        out = out + torch.matmul(probs[..., width:], own_v)
        return layer.o(out.transpose(1, 2).reshape(rows, -1))


class _Slot:
    """Where one decode step reads RoPE and writes / reads the rows' own keys and values.

    sliced (j an int): slot j written by indexing, slots 0..j read. fixed (j a 0-dim device
    tensor): slot j written by ``index_copy_``, all T_max slots read with those after j masked, so
    no shape or Python value depends on j.
    """

    def __init__(self, cos, sin, write, own_bias):
        self.cos, self.sin, self.write, self.own_bias = cos, sin, write, own_bias  # cos / sin [rows, 1, d]

    @classmethod
    def sliced(cls, j: int, step: LeanStep) -> _Slot:
        def write(cache: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
            cache[:, :, :, j] = new
            return cache[:, :, :, : j + 1]

        return cls(step.cos[j], step.sin[j], write, None)

    @classmethod
    def fixed(cls, j: torch.Tensor, step: LeanStep) -> _Slot:
        at = j.reshape(1)
        t_max = step.cos.shape[0]
        slots = torch.arange(t_max, device=j.device)
        own_bias = torch.zeros(t_max, dtype=step.bias.dtype, device=j.device).masked_fill_(
            slots > j, float("-inf")
        )

        def write(cache: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
            # under autocast new is bf16 into an fp32 cache: cast as the sliced step's assignment does
            return cache.index_copy_(3, at, new[:, :, :, None].to(cache.dtype))

        return cls(step.cos.index_select(0, at)[0], step.sin.index_select(0, at)[0], write, own_bias)


WARMUP_CALLS = 2  # eager calls on a side stream before capture (cuBLAS handles, workspaces, allocator)
# distinct shapes (prompt width, rows, T_max) one process may compile the fixed-shape step for
# (``compiled``); torch's default, 8, would end a run whose prompt widths vary (fullgraph=True
# turns the limit into an error), so bucket widths with ``pad_to_multiple_of``
RECOMPILE_LIMIT = 64


def compiled(step):
    """``step`` (a fixed-shape step: ``LeanStep(fixed_shape=True)`` or ``hf_decode.SampledStep``)
    through ``torch.compile``, so inductor fuses the chains of small ops (RMSNorm, RoPE, SiLU * up,
    residual adds, the sampler's) into few kernels. fullgraph: the step must trace whole (a graph
    break would silently bring the eager kernels back); dynamic=False: its shapes are fixed within
    a generate call, and specialised kernels are the fastest.

    On CUDA the compiled step is then captured by our own ``GraphedStep`` (compile first, then
    capture) rather than inductor's cudagraphs (``mode="reduce-overhead"``): the step writes the
    rows' own keys / values in place (``index_copy_`` into tensors that are neither parameters
    nor buffers), and inductor's cudagraph trees skip a graph that mutates such inputs; one graph
    per generate call with its static inputs is what ``GraphedStep`` already gives the eager step.
    """
    fn = torch.compile(step, fullgraph=True, dynamic=False)

    def call(*args):
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
            return fn(*args)

    return call


class GraphedStep:
    """``step(tokens [rows], j: int[, u [rows, 1]]) -> its output`` by replaying one captured graph
    of ``fixed_step(tokens, j as a 0-dim device tensor[, u])``; captured at the first call.
    ``uniform``: the step also reads the sampler's uniforms (``hf_decode.SampledStep``); its output
    (the logits, or the sampled tokens and log-probs) is static, overwritten by the next replay."""

    def __init__(self, fixed_step, rows: int, device: torch.device, uniform: bool = False):
        if torch.device(device).type != "cuda":
            raise ValueError(
                f"rollout.engines.hf.cuda_graph=true needs the model on a CUDA device, not {device}"
            )
        self.fixed_step = fixed_step
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        self.j = torch.zeros((), dtype=torch.long, device=device)
        self.u = torch.zeros((rows, 1), dtype=torch.float32, device=device) if uniform else None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out = None

    def __call__(self, tokens: torch.Tensor, j: int, u: torch.Tensor | None = None):
        self.tokens.copy_(tokens)
        self.j.fill_(j)
        if self.u is not None:
            self.u.copy_(u)
        if self.graph is None:
            self._capture()
        self.graph.replay()
        return self.out

    def _capture(self) -> None:
        # the warm-up calls run the step for real on the current inputs: they write slot j of the
        # rows' own keys / values with the values the first replay writes again (and compile a
        # compiled step)
        inputs = (self.tokens, self.j) if self.u is None else (self.tokens, self.j, self.u)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                self.fixed_step(*inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self.fixed_step(*inputs)
