"""Inference with a trained router policy: load a run's checkpoint, route a prompt, answer it once.

The seed's inference pipeline (§6): router head -> route-specific system message -> a single
rollout of the actor LM. No reference model, critic or reward model is built.

The module is rebuilt from the config stored in the run's ``manifest.yaml``; its weights come
from the checkpoint's ``state_dict``. The architecture and tokenizer are read from the *base*
model (``model.path``, the tiny model by default): a warm start (``model.warm_start=sft``) only
changes weights, which the checkpoint replaces, so it is never rebuilt here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from omegaconf import DictConfig, OmegaConf

from src.callbacks.checkpointing import latest_checkpoint
from src.rewards.dispatch import response_format
from src.rewards.tool_usage import ToolUsage
from src.rollout.routes import Route, parse_route

__all__ = [
    "InferenceResult",
    "Policy",
    "ToolCall",
    "load_router_policy",
    "parse_tool_calls",
    "resolve_run",
]

log = logging.getLogger(__name__)

ROUTE_NAMES = tuple(route.label for route in Route)  # ("answer", "search", "calculate")


# ---------------------------------------------------------------------------- locating a run
def resolve_run(run_dir_or_ckpt: str | Path) -> tuple[Path, dict[str, Any]]:
    """(checkpoint path, manifest dict) of a run directory, its ``checkpoints/`` or one ``.ckpt``.

    A run directory resolves to the manifest's ``latest_checkpoint`` (else the newest ``*.ckpt``).
    The manifest is read from the checkpoint's directory. Raises FileNotFoundError naming what
    is missing.
    """
    path = Path(run_dir_or_ckpt).expanduser()
    if path.is_file():
        ckpt, ckpt_dir = path, path.parent
    elif path.is_dir():
        ckpt_dir = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        ckpt = latest_checkpoint(ckpt_dir)
        if ckpt is None:
            raise FileNotFoundError(f"no *.ckpt in {ckpt_dir}")
    else:
        raise FileNotFoundError(f"no run directory or checkpoint at {path}")
    manifest_path = ckpt_dir / "manifest.yaml"
    if not manifest_path.is_file():
        raise FileNotFoundError(
            f"{manifest_path} not found: the run's resolved config is needed to rebuild the model"
        )
    manifest = yaml.safe_load(manifest_path.read_text()) or {}
    has_config = isinstance(manifest, Mapping) and isinstance(manifest.get("config"), Mapping)
    if not has_config:
        raise ValueError(f"{manifest_path}: no 'config' mapping (is this a toolrouter manifest?)")
    return ckpt, manifest


# ---------------------------------------------------------------------------- tool calls
@dataclass(frozen=True)
class ToolCall:
    """One tool call read from a response; ``name``/``parameters`` are None when unreadable."""

    name: str | None
    parameters: Any = None
    raw: str | None = None


def _xml_calls(response: str) -> list[ToolCall]:
    from src.rewards.tool_usage import xml_call_lines

    return [
        ToolCall(item["name"], item.get("parameters", item.get("arguments")))
        if item is not None
        else ToolCall(None, None, raw)
        for item, raw in xml_call_lines(response)[1]
    ]


def parse_tool_calls(response: str, fmt: str = "xml") -> list[ToolCall]:
    """Tool calls (name + parameters) of a decoded response, in order; unreadable calls kept as raw.

    ``fmt``: "xml" (``rlla``) or "harmony" (``rlla_gpt``). Harmony text the strict parser rejects
    falls back to the names ``tool_usage`` can still read.
    """
    if fmt == "xml":
        return _xml_calls(response)
    if fmt != "harmony":
        raise ValueError(f"unknown tool-call format {fmt!r}; expected 'xml' or 'harmony'")
    from src.rewards.harmony_parse import parse_harmony_tool_calls
    from src.rewards.tool_families import ToolFamilies
    from src.rewards.tool_usage import tool_usage

    try:
        return [ToolCall(c["name"], c.get("parameters")) for c in parse_harmony_tool_calls(response)]
    except ValueError:
        return [ToolCall(name) for name in tool_usage(response, ToolFamilies(), fmt="harmony").names]


# ---------------------------------------------------------------------------- results
@dataclass
class InferenceResult:
    """One routed, generated and parsed answer.

    ``route`` is None (and ``probs`` None) when the policy has no router head and no route was
    forced; the prompt is then used as given.
    """

    route: str | None
    probs: list[float] | None
    messages: list[dict[str, Any]]
    prompt_text: str
    response: str
    response_length: int
    tool_calls: list[ToolCall]
    usage: ToolUsage
    cost: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view."""
        out = asdict(self)
        out["usage"] = {k: v for k, v in asdict(self.usage).items()}
        return out


# ---------------------------------------------------------------------------- the policy
@dataclass
class Policy:
    """Router + actor LM of a trained run, ready for single prompts or small batches."""

    module: Any  # ToolRouterModule, eval mode, on ``device``
    tokenizer: Any
    config: DictConfig
    checkpoint: Path
    families: Any  # ToolFamilies
    cost_fn: Any  # ToolUsage -> float
    prompt_mode: str = "emphasis"
    max_new_tokens: int = 128
    micro_batch_size: int = 16
    global_step: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def has_router(self) -> bool:
        return self.module.router_head is not None

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        from src.datamodules.rlla_datamodule import prompt_token_ids

        return prompt_token_ids(self.tokenizer, [dict(m) for m in messages])

    # ------------------------------------------------------------------ routing
    @torch.no_grad()
    def route_probs(self, batch: Sequence[Sequence[Mapping[str, Any]]]) -> torch.Tensor:
        """Router probabilities [P, 3] (answer, search, calculate) of P chat prompts.

        The router sees the original prompt, as in training (the collector routes ``prompt_ids``).
        """
        if not self.has_router:
            raise ValueError(f"{self.checkpoint}: this run has no router head (router.enable=false)")
        from src.rollout.engine import left_pad

        out = []
        for start in range(0, len(batch), self.micro_batch_size):
            ids, mask = left_pad(
                [self.prompt_ids(m) for m in batch[start : start + self.micro_batch_size]],
                self.tokenizer.pad_token_id,
            )
            out.append(torch.softmax(self.module.router_logits(ids, mask).float().cpu(), dim=-1))
        return torch.cat(out)

    def route(
        self,
        messages: Sequence[Mapping[str, Any]],
        sample: bool = False,
        generator: torch.Generator | None = None,
    ) -> tuple[str, list[float]]:
        """(route name, [p_answer, p_search, p_calculate]); argmax unless ``sample``."""
        probs = self.route_probs([messages])[0]
        action = int(torch.multinomial(probs, 1, generator=generator)) if sample else int(probs.argmax())
        return ROUTE_NAMES[action], probs.tolist()

    def routed_messages(
        self, messages: Sequence[Mapping[str, Any]], route: Route | int | str, data_source: str = "rlla"
    ) -> list[dict[str, Any]]:
        """The chat messages the actor sees under ``route`` (system message rewritten)."""
        from src.rollout.route_prompts import route_messages

        return route_messages(
            messages,
            parse_route(route),
            self.families,
            mode=self.prompt_mode,
            fmt=response_format(data_source),
        )

    # ------------------------------------------------------------------ answering
    def respond(
        self,
        messages: Sequence[Mapping[str, Any]],
        data_source: str = "rlla",
        temperature: float = 0.0,
        top_p: float = 1.0,
        max_new_tokens: int | None = None,
        route: Route | int | str | None = None,
        sample_route: bool = False,
        generator: torch.Generator | None = None,
    ) -> InferenceResult:
        """Route (unless ``route`` is forced), rewrite the prompt, generate once, parse the tool calls.

        ``temperature`` 0 is greedy decoding.
        """
        return self.respond_batch(
            [messages],
            [data_source],
            temperature,
            top_p,
            max_new_tokens,
            None if route is None else [route],
            sample_route,
            generator,
        )[0]

    @torch.no_grad()
    def respond_batch(
        self,
        batch: Sequence[Sequence[Mapping[str, Any]]],
        data_sources: Sequence[str],
        temperature: float = 0.0,
        top_p: float = 1.0,
        max_new_tokens: int | None = None,
        routes: Sequence[Route | int | str] | None = None,
        sample_route: bool = False,
        generator: torch.Generator | None = None,
    ) -> list[InferenceResult]:
        """:meth:`respond` for P prompts at once (one batched generate call)."""
        from src.rewards.tool_families import tool_descriptions
        from src.rewards.tool_usage import tool_usage
        from src.rollout.engine import HFGenerateEngine, SamplingParams
        from src.rollout.single_turn import decode_response

        if len(batch) != len(data_sources) or (routes is not None and len(routes) != len(batch)):
            raise ValueError(
                f"{len(batch)} prompts but {len(data_sources)} data sources"
                f"{'' if routes is None else f' and {len(routes)} routes'}"
            )
        probs: list[list[float] | None] = [None] * len(batch)
        names: list[str | None] = [None] * len(batch)
        if routes is not None:
            names = [parse_route(r).label for r in routes]
        elif self.has_router:
            p = self.route_probs(batch)
            actions = (
                torch.multinomial(p, 1, generator=generator).squeeze(-1) if sample_route else p.argmax(-1)
            )
            names = [ROUTE_NAMES[int(a)] for a in actions]
            probs = p.tolist()
        if self.has_router and routes is not None:
            probs = self.route_probs(batch).tolist()
        routed = [
            self.routed_messages(m, r, ds) if r is not None else [dict(x) for x in m]
            for m, r, ds in zip(batch, names, data_sources)
        ]
        prompts = [self.prompt_ids(m) for m in routed]
        engine = HFGenerateEngine(
            self.module.actor,
            self.tokenizer.pad_token_id,
            [self.tokenizer.eos_token_id],
            self.micro_batch_size,
        )
        sampling = SamplingParams(
            n=1, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens or self.max_new_tokens
        )
        completions = engine.generate(prompts, sampling)
        drop = {self.tokenizer.pad_token_id, self.tokenizer.eos_token_id}
        results = []
        for i, tokens in enumerate(completions.token_lists()):
            fmt = response_format(data_sources[i])
            text = decode_response(self.tokenizer, tokens, drop)
            system = next((m.get("content", "") for m in batch[i] if m.get("role") == "system"), "")
            usage = tool_usage(text, self.families, fmt=fmt, descriptions=tool_descriptions(system or ""))
            results.append(
                InferenceResult(
                    route=names[i],
                    probs=probs[i],
                    messages=routed[i],
                    prompt_text=self.tokenizer.decode(prompts[i], skip_special_tokens=False),
                    response=text,
                    response_length=len(tokens),
                    tool_calls=parse_tool_calls(text, fmt),
                    usage=usage,
                    cost=float(self.cost_fn(usage)),
                )
            )
        return results


# ---------------------------------------------------------------------------- loading
def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_router_policy(
    run_dir_or_ckpt: str | Path,
    device: str | None = None,
    dtype: str | None = None,
    max_new_tokens: int | None = None,
) -> Policy:
    """Rebuild a run's module from its manifest config and load a checkpoint's weights.

    Args:
        run_dir_or_ckpt: a run directory (``<run>/checkpoints/manifest.yaml``), its ``checkpoints``
            folder, or one ``.ckpt`` beside a manifest.
        device: "cpu", "cuda", ...; default cuda when available.
        dtype: overrides ``model.dtype`` (e.g. "float32" for a bf16 run on CPU).
        max_new_tokens: default generation length; default the run's ``rollout.max_new_tokens``.
    """
    from src.models.loading import load_tokenizer, resolve_model_path
    from src.models.tiny import TinyModelSpec
    from src.rewards.tool_cost import make_cost_fn
    from src.rollout.factory import make_families
    from src.train import _dataclass_from, build_module

    ckpt, manifest = resolve_run(run_dir_or_ckpt)
    cfg = OmegaConf.create(manifest["config"])
    cfg.algorithm.use_kl_loss = False  # inference needs no reference model
    if dtype is not None:
        cfg.model.dtype = dtype
    base = resolve_model_path(cfg.model.path, cfg.cache_dir, _dataclass_from(TinyModelSpec, cfg.model.tiny))
    module = build_module(cfg, base)
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    if "state_dict" not in state:
        raise ValueError(f"{ckpt}: no 'state_dict' (not a Lightning checkpoint)")
    missing, unexpected = module.load_state_dict(state["state_dict"], strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{ckpt}: weights do not match the config in its manifest: "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
        )
    module.to(device or _default_device()).eval().requires_grad_(False)
    router = cfg.router
    weights = OmegaConf.to_container(router.cost_weights, resolve=True) if router.get("cost_weights") else {}
    log.info("loaded %s (global step %s) on %s", ckpt, state.get("global_step"), device or _default_device())
    return Policy(
        module=module,
        tokenizer=load_tokenizer(base),
        config=cfg,
        checkpoint=ckpt,
        families=make_families(cfg),
        cost_fn=make_cost_fn(router.cost, **weights),
        prompt_mode=router.get("prompt_mode", "emphasis"),
        max_new_tokens=int(max_new_tokens or cfg.rollout.max_new_tokens),
        micro_batch_size=int(cfg.rollout.get("micro_batch_size", 16)),
        global_step=state.get("global_step"),
        extra={"lambda": float(state["state_dict"].get("lagrange_lambda", torch.tensor(0.0)))},
    )
