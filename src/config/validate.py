"""``validate(cfg)``: the checks a composed job config must pass before anything is built.

Types and key names are the schemas' job (``src.config.job``); this adds what crosses groups and
what a type cannot say (ranges, sizes, files, lengths vs the model's positions, optional extras).
Every problem is collected and one ``ConfigError`` lists them all, each naming its key.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

from omegaconf import DictConfig

from src.config.checks import file_list, in_range, one_of, positive, unknown_keys
from src.config.dynamic_sampling import dynamic_sampling_problems
from src.config.errors import ConfigError
from src.config.validate_async import curriculum_problems, replay_problems
from src.config.validate_values import value_problems


def validate(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` listing every problem of ``cfg`` (a composed, typed job config)."""
    problems = unknown_keys(cfg)
    if problems:  # the other checks assume the schema's keys
        raise ConfigError(problems)
    for check in (
        _job,
        _sampling,
        _algorithm,
        _rollout,
        _router,
        _data,
        _env,
        _trainer,
        _lengths,
        replay_problems,
        curriculum_problems,
        dynamic_sampling_problems,
        value_problems,
    ):
        problems += check(cfg)
    if problems:
        raise ConfigError(problems)


def world_size(cfg: DictConfig) -> int:
    return int(cfg.trainer.devices) * int(cfg.trainer.num_nodes)


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
    problems += positive({"router.lambda_every_k": r.lambda_every_k})
    problems += positive({"router.lambda_kp": r.lambda_kp, "router.lambda_kd": r.lambda_kd}, strict=False)
    problems += in_range("router.lambda_cost_ema", r.lambda_cost_ema, 0.0, 1.0, high_open=True)
    problems += in_range("router.ema_decay", r.ema_decay, 0.0, 1.0, high_open=True)
    problems += positive({"router.entropy_coef": r.entropy_coef, "router.sup_coef": r.sup_coef}, strict=False)
    problems += positive({"router.entropy_decay_steps": r.entropy_decay_steps}, strict=False)
    if r.entropy_coef_final is not None:
        problems += positive({"router.entropy_coef_final": r.entropy_coef_final}, strict=False)
    # the upper bound is the cost's own (src/jobs/checks.py asks src/router/cost.py)
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
    for key in ("train_files", "val_files"):
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
        probs = {f"data.synthetic.{k}": s[k] for k in ("p_search", "p_calculate", "p_answer")}
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
    problems = positive(
        {"trainer.save_freq": t.save_freq, "trainer.devices": t.devices, "trainer.num_nodes": t.num_nodes}
    )
    problems += positive({"trainer.log_every_n_steps": t.log_every_n_steps})
    problems += positive(
        {"trainer.max_steps": t.max_steps, "trainer.limit_val_batches": t.limit_val_batches}, strict=False
    )
    if t.val_check_interval is not None:
        problems += positive({"trainer.val_check_interval": t.val_check_interval})
    return problems


def max_positions(cfg: DictConfig) -> tuple[int | None, str]:
    """The model's ``max_position_embeddings`` and where it was read (None when unknown)."""
    return model_config_value(cfg, "max_position_embeddings")


def model_config_value(cfg: DictConfig, key: str) -> tuple[int | None, str]:
    """An integer of the model's config (``model.tiny`` or ``<model.path>/config.json``) and where it
    was read; None when unknown."""
    m = cfg.model
    if m.path == "tiny":
        return int(m.tiny[key]), f"model.tiny.{key}"
    config_json = Path(m.path) / "config.json"
    if not config_json.is_file():
        return None, str(config_json)
    try:
        value = json.loads(config_json.read_text()).get(key)
    except (ValueError, AttributeError):  # not a JSON object: named by validate_values.model_config
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
    return []
