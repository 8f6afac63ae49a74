"""``validate(cfg)``: the checks a composed job config must pass before anything is built.

Types and key names are the schemas' job (``src.config.job``); these add what crosses groups and what
a type cannot say (ranges, sizes, files, lengths vs the model's positions, finite numbers, lessons).
Each check returns ``"<key>: <problem>"`` lines; one ``ConfigError`` lists them all. Registry
names: ``src.jobs.checks.validate_job`` (config imports none)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from src.config.job import file_list


class UserError(Exception):
    """A command the user fixes (config, data file, run directory), not a bug: the entry point prints
    it as one line and exits 2. Subclasses also derive from the built-in error a caller would catch."""


class ConfigError(UserError, ValueError):
    """A job config that cannot run. ``problems`` lists ``"<key>: <what is wrong>"`` lines."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s) in the job config:\n{lines}")


# ---------------------------------------------------------------------------- the checks' vocabulary
def unknown_keys(node: Any, prefix: str = "") -> list[str]:
    """Keys a typed node's schema does not declare (``+key=`` overrides slip past composition)."""
    if not isinstance(node, DictConfig) or node._is_none() or node._is_missing():
        return []
    schema = OmegaConf.get_type(node)
    declared = {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else None
    problems = []
    for key in node:
        full = f"{prefix}{key}"
        if declared is not None and key not in declared:
            problems.append(f"{full}: unknown key (not in {schema.__name__}: {sorted(declared)})")
            continue
        problems += unknown_keys(node._get_node(key), f"{full}.")
    return problems


def positive(values: dict[str, Any], strict: bool = True) -> list[str]:
    """Each ``key -> number`` must be > 0 (``strict``) or >= 0."""
    bad = []
    for key, v in values.items():
        if v is None or not isinstance(v, (int, float)) or math.isnan(v) or (v <= 0 if strict else v < 0):
            bad.append(f"{key}: must be {'> 0' if strict else '>= 0'}, got {v!r}")
    return bad


def in_range(key: str, v: Any, low: float, high: float, low_open: bool = False, high_open: bool = False):
    """``key``'s value in [low, high] (ends open when asked)."""
    ok = isinstance(v, (int, float)) and not math.isnan(v)
    ok = ok and (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
    if ok:
        return []
    lo, hi = "(" if low_open else "[", ")" if high_open else "]"
    return [f"{key}: must be in {lo}{low}, {high}{hi}, got {v!r}"]


def one_of(key: str, v: Any, choices: Iterable[Any]) -> list[str]:
    choices = list(choices)
    return [] if v in choices else [f"{key}: {v!r} is not one of {choices}"]


# ---------------------------------------------------------------------------- per group
def validate(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` listing every problem of ``cfg`` (a composed, typed job config)."""
    problems = unknown_keys(cfg)
    if problems:  # the other checks assume the schema's keys
        raise ConfigError(problems)
    groups = (_job, _sampling, _algorithm, _rollout, _router, _data, _env, _trainer, _lengths)
    across = (replay_problems, curriculum_problems, dynamic_sampling_problems, value_problems)
    for check in (*groups, *across):
        problems += check(cfg)
    if problems:
        raise ConfigError(problems)


def world_size(cfg: DictConfig) -> int:
    return int(cfg.trainer.devices) * int(cfg.trainer.num_nodes)


MISROUTED_TOOLS = ("first", "request_hash")  # sft.misrouted_tool (src.jobs.route_sft)


def _job(cfg: DictConfig) -> list[str]:
    m = cfg.model
    problems = one_of("task", cfg.task, ("rl", "sft"))
    problems += one_of("model.warm_start", m.warm_start, (None, "sft", "rlvcr_sft"))
    problems += one_of("model.dtype", m.dtype, ("float32", "bfloat16", "float16"))
    if cfg.trainer.accelerator == "cpu" and m.dtype != "float32":
        problems.append(f"model.dtype: {m.dtype} on trainer.accelerator=cpu; CPU runs are float32 only")
    s = cfg.sft
    problems += positive({"sft.max_steps": s.max_steps, "sft.batch_size": s.batch_size, "sft.lr": s.lr})
    problems += positive({"sft.max_length": s.max_length, "sft.episodes": s.episodes})
    problems += one_of("sft.misrouted_tool", s.misrouted_tool, MISROUTED_TOOLS)
    return problems


def _sampling(cfg: DictConfig) -> list[str]:
    """Training sampling must be stochastic; sizes >= 1; eval sizes too; prompts split over ranks."""
    s = cfg.sampling
    problems = positive({"sampling.temperature": s.temperature})
    problems += in_range("sampling.top_p", s.top_p, 0.0, 1.0, low_open=True)
    sizes = {f"sampling.{k}": s[k] for k in ("n_prompts", "n_generations_per_prompt", "max_new_tokens")}
    problems += positive(sizes)
    e = s.eval
    if e.temperature is not None:
        problems += positive({"sampling.eval.temperature": e.temperature}, strict=False)
    if e.top_p is not None:
        problems += in_range("sampling.eval.top_p", e.top_p, 0.0, 1.0, low_open=True)
    for k in ("n_prompts", "n_generations_per_prompt", "max_new_tokens"):
        if e[k] is not None:
            problems += positive({f"sampling.eval.{k}": e[k]})
    world = world_size(cfg)
    for key, n in (("sampling.n_prompts", s.n_prompts), ("sampling.eval.n_prompts", e.n_prompts)):
        if isinstance(n, int) and n > 0 and n % world:
            problems.append(
                f"{key}={n} is not divisible by trainer.devices x trainer.num_nodes = {world} "
                "(the prompts of a step are split evenly over the ranks)"
            )
    return problems


def _algorithm(cfg: DictConfig) -> list[str]:
    a, o = cfg.algorithm, cfg.algorithm.optim
    problems = []
    problems += positive(
        {"algorithm.ppo_epochs": a.ppo_epochs, "algorithm.micro_batch_size": a.micro_batch_size}
    )
    problems += positive({"algorithm.adv_eps": a.adv_eps, "algorithm.grad_clip": a.grad_clip})
    nonneg = {f"algorithm.{k}": a[k] for k in ("ppo_mini_batch_size", "kl_coef", "entropy_coeff")}
    problems += positive(nonneg, strict=False)
    problems += in_range("algorithm.clip_ratio_low", a.clip_ratio_low, 0.0, 1.0, high_open=True)
    problems += positive({"algorithm.clip_ratio_high": a.clip_ratio_high}, strict=False)
    problems += positive({"algorithm.optim.lr": o.lr})
    problems += positive(
        {"algorithm.optim.weight_decay": o.weight_decay, "algorithm.optim.warmup_steps": o.warmup_steps},
        strict=False,
    )
    if a.rollout_is is not None:
        problems += one_of("algorithm.rollout_is", a.rollout_is, ("token", "sequence"))
        problems += positive({"algorithm.rollout_is_cap": a.rollout_is_cap})
    for i, beta in enumerate(o.betas):
        problems += in_range(f"algorithm.optim.betas[{i}]", beta, 0.0, 1.0, high_open=True)
    if a.adv_estimator == "rlvcr":
        problems += positive(
            {
                "algorithm.cost_max": a.cost_max,
                "algorithm.rlvcr_think_max_new_tokens": a.rlvcr_think_max_new_tokens,
            }
        )
    return problems


def _rollout(cfg: DictConfig) -> list[str]:
    r = cfg.rollout
    problems = positive({"rollout.micro_batch_size": r.micro_batch_size})
    if r.engine not in r.engines:
        return problems + [f"rollout.engine: {r.engine!r} is not one of rollout.engines {sorted(r.engines)}"]
    if "_target_" not in r.engines[r.engine]:
        problems.append(f"rollout.engines.{r.engine}: no _target_ to build the engine with")
    if r.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        problems.append(
            'rollout.engine=vllm: vLLM is not installed; install it: make vllm-env (CPU) or pip install -e ".[vllm]" (GPU); see the README'
        )
    unkeyed = {"hf": ("decode", "generate"), "vllm": ("mode", "server")}.get(r.engine)
    if r.keyed_draws and unkeyed and r.engines[r.engine].get(unkeyed[0]) == unkeyed[1]:
        bad = f"rollout.engines.{r.engine}.{unkeyed[0]}={unkeyed[1]}"
        problems.append(f"rollout.keyed_draws=true: {bad} draws every row from one stream (set it false)")
    return problems


def _router(cfg: DictConfig) -> list[str]:
    r = cfg.router
    if not r.enable:
        return []
    problems = one_of("router.pooling", r.pooling, ("last", "mean", "tail", "sif"))
    problems += one_of("router.prompt_mode", r.prompt_mode, ("emphasis", "only_family"))
    problems += one_of("router.actor_reward", r.actor_reward, ("task", "router"))
    problems += positive(
        {"router.lr": r.lr, "router.mlp_hidden": r.mlp_hidden, "router.lambda_lr": r.lambda_lr}
    )
    problems += one_of("router.input", r.input, ("actor", "base_embeddings"))
    if r.input == "base_embeddings" and r.hidden_layer != 0:
        problems.append(
            f"router.hidden_layer={r.hidden_layer}: router.input=base_embeddings reads the base model's "
            "input embeddings (layer 0); set router.hidden_layer=0"
        )
    if r.input == "base_embeddings" and not r.detach_backbone:
        problems.append(
            "router.detach_backbone=false: router.input=base_embeddings reads a frozen table, so no "
            "gradient reaches the actor; set it true"
        )
    if r.pooling == "sif":
        problems += positive({"router.sif_a": r.sif_a, "router.tail_tokens": r.tail_tokens})
        problems += positive({"router.sif_unseen_weight": r.sif_unseen_weight}, strict=False)
        problems += one_of("router.sif_unseen_unit", r.sif_unseen_unit, ("token", "word"))
    problems += positive({"router.lambda_every_k": r.lambda_every_k})
    problems += positive({"router.lambda_kp": r.lambda_kp, "router.lambda_kd": r.lambda_kd}, strict=False)
    problems += in_range("router.lambda_cost_ema", r.lambda_cost_ema, 0.0, 1.0, high_open=True)
    problems += in_range("router.ema_decay", r.ema_decay, 0.0, 1.0, high_open=True)
    problems += positive({"router.entropy_coef": r.entropy_coef, "router.sup_coef": r.sup_coef}, strict=False)
    problems += positive({"router.entropy_decay_steps": r.entropy_decay_steps}, strict=False)
    if r.entropy_coef_final is not None:
        problems += positive({"router.entropy_coef_final": r.entropy_coef_final}, strict=False)
    # the upper bound is the cost's own (src/jobs/checks.py asks src/router/usage.py)
    problems += in_range("router.budget", r.budget, 0.0, math.inf)
    problems += positive({"router.lambda_init": r.lambda_init}, strict=False)
    if r.lambda_max is not None and r.lambda_max < r.lambda_init:
        problems.append(f"router.lambda_max={r.lambda_max} is below router.lambda_init={r.lambda_init}")
    return problems + _router_layer(cfg)


def _router_layer(cfg: DictConfig) -> list[str]:
    """``router.hidden_layer`` indexes the backbone's hidden states: the embeddings and one per layer."""
    layers, source = model_config_value(cfg, "num_hidden_layers")
    k = cfg.router.hidden_layer
    if layers is None or -(layers + 1) <= k <= layers:
        return []
    return [f"router.hidden_layer={k}: the model has {layers} layers ({source}), so -{layers + 1}..{layers}"]


def _data(cfg: DictConfig) -> list[str]:
    d = cfg.data
    if d.kind == "seeds":
        problems = positive({"data.n_seeds": d.n_seeds})
        if not cfg.env.enable:
            problems.append(
                "data.kind=seeds: env seeds need an environment (env=local_bos | local_pd | mlgym)"
            )
        return problems
    problems = one_of("data.kind", d.kind, ("files", "synthetic"))
    problems += one_of("data.format", d.format, ("xml", "harmony"))
    problems += positive({"data.max_prompt_length": d.max_prompt_length})
    for key in ("train_files", "val_files", "calib_files"):
        try:
            files = file_list(d[key])
        except TypeError as err:
            problems.append(f"data.{key}: {err}")
            continue
        problems += [f"data.{key}: file not found: {f}" for f in files if not Path(f).is_file()]
    if d.kind == "files" and not file_list(d.train_files):
        problems.append("data.train_files: empty (data.kind=files needs at least one parquet file)")
    if d.kind == "synthetic":
        s = d.synthetic
        problems += positive({"data.synthetic.n_train": s.n_train, "data.synthetic.n_test": s.n_test})
        probs = {f"data.synthetic.{k}": s[k] for k in ("p_search", "p_calculate", "p_answer", "n_calib")}
        problems += positive(probs, strict=False)
    if cfg.env.enable:
        problems.append(f"env.enable=true needs data=seeds (data.kind is {d.kind})")
    return problems


def _env(cfg: DictConfig) -> list[str]:
    e = cfg.env
    if not e.enable:
        return []
    problems = positive(
        {"env.token_budget": e.token_budget, "env.turn_cap": e.turn_cap, "env.env_workers": e.env_workers}
    )
    backend, _, task = str(e.id).partition("/")
    if backend not in ("local", "mlgym") or not task:
        problems.append(f"env.id: {e.id!r} must look like 'local/<game>' or 'mlgym/<task>'")
    temps = e.temperatures
    if temps is not None:
        values = [temps] if isinstance(temps, (int, float)) else list(temps)
        problems += positive({f"env.temperatures[{i}]": t for i, t in enumerate(values)})
    if e.turn_cap > e.token_budget:
        problems.append(f"env.turn_cap={e.turn_cap} exceeds env.token_budget={e.token_budget}")
    return problems


def _trainer(cfg: DictConfig) -> list[str]:
    t = cfg.trainer
    counts = ("save_freq", "devices", "num_nodes", "log_every_n_steps", "max_steps")  # max_steps 0: a no-op
    problems = positive({f"trainer.{k}": t[k] for k in counts})
    problems += positive({"trainer.limit_val_batches": t.limit_val_batches}, strict=False)
    if t.val_check_interval is not None:
        problems += positive({"trainer.val_check_interval": t.val_check_interval})
    groups = ("callbacks", "sft_callbacks")
    callbacks = [(f"{g}.{k}", v) for g in groups for k, v in (cfg.get(g) or {}).items()]
    bad = [k for k, v in callbacks if v is not None and not (OmegaConf.is_dict(v) and "_target_" in v)]
    return problems + [f"{k}: no _target_ to build the callback with (null leaves it out)" for k in bad]


def max_positions(cfg: DictConfig) -> tuple[int | None, str]:
    """The model's ``max_position_embeddings`` and where it was read (None when unknown)."""
    return model_config_value(cfg, "max_position_embeddings")


def model_config_value(cfg: DictConfig, key: str) -> tuple[int | None, str]:
    """An integer of the model's config (``model.tiny`` or ``<model.path>/config.json``), and where."""
    m = cfg.model
    if m.path == "tiny":
        return int(m.tiny[key]), f"model.tiny.{key}"
    config_json = Path(m.path) / "config.json"
    if not config_json.is_file():
        return None, str(config_json)
    try:
        value = json.loads(config_json.read_text()).get(key)
    except (ValueError, AttributeError):  # not a JSON object: named by model_config
        return None, str(config_json)
    return (int(value) if value is not None else None), f"{config_json} {key}"


def _lengths(cfg: DictConfig) -> list[str]:
    m = cfg.model
    if m.path != "tiny" and not (Path(m.path) / "config.json").is_file():
        return [f"model.path: {m.path!r} is not a Hugging Face model directory (no config.json)"]
    limit, source = max_positions(cfg)
    if limit is None:
        return []
    if cfg.data.kind != "seeds":
        total = cfg.data.max_prompt_length + cfg.sampling.max_new_tokens
        if total > limit:
            return [
                f"data.max_prompt_length + sampling.max_new_tokens = {cfg.data.max_prompt_length} + "
                f"{cfg.sampling.max_new_tokens} = {total} exceeds the model's {limit} positions ({source})"
            ]
    elif cfg.env.enable and cfg.env.token_budget > limit:
        return [f"env.token_budget={cfg.env.token_budget} exceeds the model's {limit} positions ({source})"]
    return _engine_lengths(cfg, limit, source)


def _engine_lengths(cfg: DictConfig, limit: int, source: str) -> list[str]:
    """Every engine's ``max_model_len`` within the model's positions (an engine refuses it late)."""
    lengths = {name: node.get("max_model_len") for name, node in (cfg.rollout.get("engines") or {}).items()}
    return [
        f"rollout.engines.{name}.max_model_len={n} exceeds the model's {limit} positions ({source}); "
        "leave it null to use them"
        for name, n in lengths.items()
        if n is not None and int(n) > limit
    ]


# ---------------------------------------------------------------------------- values of any group
# keys of the episode environments' own limits: each must be > 0 where the environment has it
ENV_POSITIVE = (
    "rounds", "simulations", "max_steps", "command_timeout_s", "eval_timeout_s", "max_output_chars",
    "memory_mb", "file_size_mb", "max_processes", "workspace_mb",
)  # fmt: skip
CONFINEMENTS = ("auto", "bwrap", "unshare")


def value_problems(cfg: DictConfig) -> list[str]:
    """Every problem found by the value checks below (none needs to know a component)."""
    t = cfg.trainer.get("threads")
    threads = [] if t is None else positive({"trainer.threads": t})
    return non_finite(cfg) + env_limits(cfg) + synthetic_proportions(cfg) + model_config(cfg) + threads


def _schema_default(node: Any, key: Any) -> Any:
    """The default the node's structured schema gives ``key`` (None when untyped or no default)."""
    schema = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
    if not dataclasses.is_dataclass(schema):
        return None
    field = {f.name: f for f in dataclasses.fields(schema)}.get(str(key))
    return None if field is None or field.default is dataclasses.MISSING else field.default


def _leaves(node: Any, prefix: str):
    """(key, value, schema default) of every leaf under ``node``; unresolvable interpolations skipped."""
    keys = range(len(node)) if isinstance(node, ListConfig) else list(node.keys())
    for key in keys:
        full = f"{prefix}[{key}]" if isinstance(node, ListConfig) else f"{prefix}{'.' if prefix else ''}{key}"
        try:
            value = node[key]
        except Exception:  # noqa: BLE001 - e.g. ${hydra:...} outside a Hydra run: not a number
            continue
        if isinstance(value, (DictConfig, ListConfig)):
            yield from _leaves(value, full)
        else:
            yield full, value, _schema_default(node, key)


def non_finite(cfg: DictConfig) -> list[str]:
    """Every float anywhere in ``cfg`` must be finite (inf / nan pass most range checks silently).

    A key whose schema default is itself infinite (a threshold meaning "never") may be +-inf; nan
    never passes.
    """
    problems = []
    for key, value, default in _leaves(cfg, ""):
        if not isinstance(value, float) or math.isfinite(value):
            continue
        unbounded = isinstance(default, float) and math.isinf(default)
        if math.isnan(value) or not unbounded:
            problems.append(f"{key}: must be a finite number, got {value!r}")
    return problems


def env_limits(cfg: DictConfig) -> list[str]:
    """An enabled episode environment's limits are > 0 and its confinement is a known tool."""
    e = cfg.get("env")
    if e is None or not e.get("enable", False):
        return []
    present = {f"env.{k}": e[k] for k in ENV_POSITIVE if k in e and e[k] is not None}
    problems = positive(present)
    if "confinement" in e:
        problems += one_of("env.confinement", e.confinement, CONFINEMENTS)
    return problems


def synthetic_proportions(cfg: DictConfig) -> list[str]:
    d = cfg.get("data")
    if d is None or d.get("kind") != "synthetic":
        return []
    s = d.synthetic
    probs = {k: s[k] for k in ("p_search", "p_calculate", "p_answer")}
    numbers = [v for v in probs.values() if isinstance(v, (int, float)) and math.isfinite(v)]
    if len(numbers) == len(probs) and sum(numbers) <= 0:
        keys = ", ".join(f"data.synthetic.{k}" for k in probs)
        return [f"{keys}: all zero; at least one kind of row must have a positive proportion"]
    return []


def model_config(cfg: DictConfig) -> list[str]:
    """A model directory's ``config.json`` must be a JSON object (the problem names the file)."""
    path = cfg.model.path
    if path in (None, "", "tiny"):
        return []
    config = Path(str(path)).expanduser() / "config.json"
    if not config.is_file():
        return []  # the lengths check names a missing config.json
    try:
        parsed = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return [f"model.path: {config} is not valid JSON ({err})"]
    if not isinstance(parsed, dict):
        return [f"model.path: {config} holds {type(parsed).__name__}, not a JSON object"]
    return []


# ---------------------------------------------------------------------------- replay, workers, curriculum
LESSON_SOURCES = ("synthetic", "synthetic_multi", "files")


def replay_problems(cfg: DictConfig) -> list[str]:
    r, w = cfg.replay, cfg.rollout.workers
    problems = positive(
        {
            "replay.capacity": r.capacity,
            "replay.alpha": r.alpha,
            "replay.max_batch_latency": r.max_batch_latency,
        },
        strict=False,
    )
    problems += positive({"replay.max_samples_per_rollout": r.max_samples_per_rollout})
    problems += positive({"rollout.workers": w}, strict=False) + positive(
        {"rollout.weight_sync_every": cfg.rollout.weight_sync_every}
    )
    if (r.capacity > 0 or w > 0) and cfg.router.enable:
        problems.append(
            "replay.capacity / rollout.workers: the replay buffer serves the actor only; set router=off"
        )
    if (r.capacity > 0 or w > 0) and cfg.env.enable:
        problems.append("replay.capacity / rollout.workers: single-turn data only (env.enable is true)")
    if w > 0 and r.capacity <= 0:
        problems.append(
            "rollout.workers > 0 needs replay.capacity > 0: workers produce into the replay buffer"
        )
    if r.capacity > 0 and cfg.algorithm.old_log_prob_source != "rollout":
        problems.append(
            "replay.capacity > 0 needs algorithm.old_log_prob_source=rollout: replayed samples are "
            "off-policy, so the ratio is taken against the log-probs they were sampled with"
        )
    if w > 0 and importlib.util.find_spec("ray") is None:
        problems.append('rollout.workers > 0: Ray is not installed; pip install -e ".[async]"')
    return problems


def curriculum_problems(cfg: DictConfig) -> list[str]:
    c = cfg.curriculum
    if not c.enable:
        return []
    if not c.lessons:
        return ["curriculum.enable: true but curriculum.lessons is empty"]
    problems = positive(
        {"curriculum.eval_frequency": c.eval_frequency, "curriculum.eval_prompts": c.eval_prompts}
    )
    for lid, lesson in c.lessons.items():
        problems += one_of(f"curriculum.lessons.{lid}.source", lesson.source, LESSON_SOURCES)
        if lesson.source == "files" and not (lesson.train_files and lesson.eval_files):
            problems.append(f"curriculum.lessons.{lid}: source=files needs train_files and eval_files")
        problems += positive({f"curriculum.lessons.{lid}.weight": lesson.weight})
    if cfg.replay.capacity > 0 or cfg.env.enable:
        problems.append("curriculum.enable: single-turn, on-policy jobs only (replay.capacity 0, env off)")
    try:
        validate_lessons(c.lessons)
    except ConfigError as err:
        problems += err.problems
    return problems


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
    """Raise ``ConfigError`` naming unknown dependency ids and a dependency cycle, if any. ``lessons``:
    ``{lesson_id: lesson}``, each with ``dependencies`` (lesson ids, or mappings/objects with a
    ``dependency_id``)."""
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


# ---------------------------------------------------------------------------- dynamic sampling
ON_CHOICES = ("actor", "router", "either")
SHARDED = ("fsdp", "deepspeed_stage_3")


def dynamic_sampling_problems(cfg: DictConfig) -> list[str]:
    """Start-up checks of ``algorithm.dynamic_sampling`` (each line names its key)."""
    d, key = cfg.algorithm.dynamic_sampling, "algorithm.dynamic_sampling"
    if not d.enable:
        return []
    problems = one_of(f"{key}.on", d.on, ON_CHOICES)
    problems += positive({f"{key}.max_extra_batches": d.max_extra_batches}, strict=False)
    problems += positive({f"{key}.eps": d.eps})
    if d.on == "router" and not cfg.router.enable:
        problems.append(f"{key}.on: 'router' needs router.enable (router=on)")
    if cfg.sampling.n_generations_per_prompt < 2:
        problems.append(
            f"{key}.enable: groups of one rollout never vary (sampling.n_generations_per_prompt < 2)"
        )
    if cfg.env.enable or cfg.curriculum.enable or cfg.replay.capacity > 0 or cfg.rollout.workers > 0:
        problems.append(
            f"{key}.enable: single-turn, on-policy jobs from the data group's prompts only "
            "(env off, curriculum off, replay.capacity 0, rollout.workers 0)"
        )
    world = world_size(cfg)
    if world > 1 and cfg.trainer.strategy in SHARDED:
        # each rank refills on its own: a generate that gathers sharded weights would wait on ranks
        # that collect fewer refills
        problems.append(
            f"{key}.enable: not with a sharded trainer.strategy ({cfg.trainer.strategy}) on {world} ranks"
        )
    return problems
