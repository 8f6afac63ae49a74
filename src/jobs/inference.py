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
from src.rewards.rlla import RewardBreakdown, RewardConfig
from src.router.routes import Route, parse_route
from src.router.usage import ToolUsage

__all__ = [
    "InferenceResult",
    "InferenceSettings",
    "Policy",
    "ToolCall",
    "load_router_policy",
    "parse_tool_calls",
    "resolve_run",
]

log = logging.getLogger(__name__)


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
    from src.router.usage import xml_call_lines

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
    from src.formats.harmony import parse_harmony_tool_calls
    from src.router.families import ToolFamilies
    from src.router.usage import tool_usage

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
    reward: RewardBreakdown | None = None  # with ground truths only
    weak_label: str | None = None  # with ground truths only

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view."""
        out = asdict(self)
        out["usage"] = {k: v for k, v in asdict(self.usage).items()}
        if self.reward is None:
            out.pop("reward")
        if self.weak_label is None:
            out.pop("weak_label")
        return out


# ---------------------------------------------------------------------------- the policy
@dataclass(frozen=True)
class InferenceSettings:
    """How ``Policy.respond`` answers: ``temperature`` 0 is greedy decoding; ``max_new_tokens``
    None = the policy's own; ``sample_route`` samples the route instead of taking the argmax."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int | None = None
    sample_route: bool = False


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
    reward_config: RewardConfig | None = None
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
    def route_logits(self, batch: Sequence[Sequence[Mapping[str, Any]]]) -> torch.Tensor:
        """Router logits [P, 3] of P chat prompts (the original prompts, as the collector routes them),
        from the head's Polyak average where the run kept one (``router.ema_decay``)."""
        if not self.has_router:
            raise ValueError(f"{self.checkpoint}: this run has no router head (router.enable=false)")
        from functools import partial

        from src.rollout.single_turn import router_logits

        ids = [self.prompt_ids(m) for m in batch]
        logits_fn = partial(self.module.router_logits, averaged=True)
        return router_logits(logits_fn, ids, self.tokenizer.pad_token_id, self.micro_batch_size)

    def route_probs(self, batch: Sequence[Sequence[Mapping[str, Any]]]) -> torch.Tensor:
        """Router probabilities [P, 3] (answer, search, calculate) of P chat prompts."""
        return torch.softmax(self.route_logits(batch), dim=-1)

    def route(
        self,
        messages: Sequence[Mapping[str, Any]],
        sample: bool = False,
        generator: torch.Generator | None = None,
    ) -> tuple[str, list[float]]:
        """(route name, [p_answer, p_search, p_calculate]); argmax unless ``sample``."""
        decision = self.decide([messages], None, sample, generator)
        return decision.names()[0], decision.probs[0].tolist()

    def decide(
        self,
        batch: Sequence[Sequence[Mapping[str, Any]]],
        routes: Sequence[Route | int | str] | None,
        sample: bool,
        generator: torch.Generator | None,
    ):
        """The route decision (``src.rollout.single_turn.RouteDecision``) of P prompts, one row each;
        ``routes`` forces it; None when there is neither a router nor a forced route."""
        from src.rollout.single_turn import decide_routes, forced_routes

        logits = self.route_logits(batch) if self.has_router else None
        if routes is not None:
            return forced_routes(logits, routes)
        return None if logits is None else decide_routes(logits, 1, sample, generator)

    def routed_messages(
        self, messages: Sequence[Mapping[str, Any]], route: Route | int | str, data_source: str = "rlla"
    ) -> list[dict[str, Any]]:
        """The chat messages the actor sees under ``route`` (system message rewritten)."""
        from src.router.routes import prompt_context, routed_messages

        ctx = prompt_context(messages, data_source, self.families)
        return routed_messages(ctx, parse_route(route), self.families, self.prompt_mode)

    # ------------------------------------------------------------------ answering
    def respond(
        self,
        messages: Sequence[Mapping[str, Any]],
        data_source: str = "rlla",
        route: Route | int | str | None = None,
        settings: InferenceSettings = InferenceSettings(),
        generator: torch.Generator | None = None,
    ) -> InferenceResult:
        """Route (unless ``route`` is forced), rewrite the prompt, generate once, parse the tool calls."""
        return self.respond_batch(
            [messages], [data_source], None if route is None else [route], settings, generator
        )[0]

    @torch.no_grad()
    def respond_batch(
        self,
        batch: Sequence[Sequence[Mapping[str, Any]]],
        data_sources: Sequence[str],
        routes: Sequence[Route | int | str] | None = None,
        settings: InferenceSettings = InferenceSettings(),
        generator: torch.Generator | None = None,
        ground_truths: Sequence[str] | None = None,
    ) -> list[InferenceResult]:
        """:meth:`respond` for P prompts at once (one batched generate call), through the collector's
        own route / routed-prompt / generate / decode / score functions. With ``ground_truths`` each
        result also carries its reward parts and weak label."""
        from src.config.sampling import SamplingParams
        from src.router.routes import prompt_context

        _check_lengths(batch, data_sources, routes, ground_truths)
        truths = ground_truths if ground_truths is not None else [None] * len(batch)
        contexts = [
            prompt_context(m, ds, self.families, gt) for m, ds, gt in zip(batch, data_sources, truths)
        ]
        decision = self.decide(batch, routes, settings.sample_route, generator)
        sampling = SamplingParams(
            n_generations_per_prompt=1,
            temperature=settings.temperature,
            top_p=settings.top_p,
            max_new_tokens=settings.max_new_tokens or self.max_new_tokens,
        )
        return self._answer(contexts, decision, sampling, ground_truths)

    def _answer(self, contexts, decision, sampling, ground_truths) -> list[InferenceResult]:
        """Routed prompts -> one generate call -> decoded, scored results."""
        from src.rollout.engines.hf import HFGenerateEngine
        from src.rollout.single_turn import ResponseScorer, routed_prompts

        actions = [None] * len(contexts) if decision is None else decision.action.tolist()
        messages, prompts = routed_prompts(
            self.prompt_ids, contexts, actions, self.families, self.prompt_mode
        )
        tok = self.tokenizer
        engine = HFGenerateEngine(
            self.module.actor, tok.pad_token_id, [tok.eos_token_id], self.micro_batch_size
        )
        completions = engine.generate(prompts, sampling)
        scorer = ResponseScorer(self.families, self.cost_fn, self.reward_config)
        scored = scorer.score_tokens(
            tok, completions.token_lists(), {tok.pad_token_id, tok.eos_token_id}, contexts, ground_truths
        )
        names = [None] * len(contexts) if decision is None else decision.names()
        probs = [None] * len(contexts) if decision is None or not self.has_router else decision.probs.tolist()
        return [
            InferenceResult(
                route=names[i],
                probs=probs[i],
                messages=messages[i],
                prompt_text=tok.decode(prompts[i], skip_special_tokens=False),
                response=s.text,
                response_length=s.length,
                tool_calls=parse_tool_calls(s.text, contexts[i].fmt),
                usage=s.usage,
                cost=s.cost,
                reward=s.reward,
                weak_label=contexts[i].weak_label,
            )
            for i, s in enumerate(scored)
        ]


def _check_lengths(batch, data_sources, routes, ground_truths) -> None:
    sizes = {"data sources": data_sources, "routes": routes, "ground truths": ground_truths}
    bad = {k: len(v) for k, v in sizes.items() if v is not None and len(v) != len(batch)}
    if bad:
        raise ValueError(f"{len(batch)} prompts but " + ", ".join(f"{n} {k}" for k, n in bad.items()))


# ---------------------------------------------------------------------------- loading
def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_checkpoint_weights(module, ckpt: Path) -> dict[str, Any]:
    """Load a Lightning checkpoint's ``state_dict`` into ``module`` (strict); returns the checkpoint.

    Raises ValueError naming the file when it is not a Lightning checkpoint or its weights do not
    match the module the manifest's config builds.
    """
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
    return state


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
        max_new_tokens: default generation length; default the run's ``sampling.max_new_tokens``.
    """
    from src.jobs.build import build_module
    from src.jobs.warm_start import base_model_dir
    from src.models.loading import load_tokenizer
    from src.rollout.factory import make_families
    from src.router.usage import make_cost_fn

    ckpt, manifest = resolve_run(run_dir_or_ckpt)
    cfg = OmegaConf.create(manifest["config"])
    cfg.algorithm.use_kl_loss = False  # inference needs no reference model
    if dtype is not None:
        cfg.model.dtype = dtype
    base = base_model_dir(cfg)
    module = build_module(cfg, base)
    state = load_checkpoint_weights(module, ckpt)
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
        reward_config=RewardConfig(**OmegaConf.to_container(cfg.reward, resolve=True)),
        max_new_tokens=int(max_new_tokens or cfg.sampling.max_new_tokens),
        micro_batch_size=int(cfg.rollout.get("micro_batch_size", 16)),
        global_step=state.get("global_step"),
        extra={"lambda": float(state["state_dict"].get("lagrange.lam", torch.tensor(0.0)))},
    )
