"""The swappable components come from their ``_target_``: engine, datamodule, environment,
strategy, loss module."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from src.config.job import compose_job


def test_engine_from_its_target(tiny):
    from src.rollout.engines.hf import HFGenerateEngine
    from src.rollout.factory import make_engine

    model, tok = tiny
    cfg = compose_job(["experiment=grpo", "rollout.micro_batch_size=8"])
    engine = make_engine(cfg.rollout, tok, model, model_path=None)
    assert isinstance(engine, HFGenerateEngine) and engine.settings.micro_batch_size == 8


def test_datamodules_from_their_target(tiny, cache_dir, tmp_path):
    from src.datamodules.rlla_datamodule import RLLADataModule, SeedDataModule
    from src.jobs.build import build_datamodule

    tok = tiny[1]
    cfg = compose_job(
        ["experiment=grpo", f"cache_dir={cache_dir}", "sampling.n_prompts=6", "trainer.devices=2"]
    )
    dm = build_datamodule(cfg, tok)
    assert isinstance(dm, RLLADataModule) and dm.batch_size == 3  # 6 prompts over 2 ranks
    seeds = build_datamodule(compose_job(["experiment=mlgym_grpo", "seed=7", f"cache_dir={tmp_path}"]), tok)
    assert isinstance(seeds, SeedDataModule) and (seeds.batch_size, seeds.seed) == (2, 7)


def test_env_from_its_target():
    from src.envs.local_game import LocalGameEnv
    from src.rollout.factory import env_factory

    cfg = compose_job(["experiment=mlgym_grpo", "env=local_pd", "env.rounds=3"])
    env = env_factory(OmegaConf.to_container(cfg.env, resolve=True))()
    try:
        assert (
            isinstance(env, LocalGameEnv)
            and env.config.game == "prisoners_dilemma"
            and env.config.rounds == 3
        )
    finally:
        env.close()


class _MyStrategy:
    """A researcher's strategy: built from its node, nothing in src/ edited."""

    def __init__(self, *, grad_clip: float, world: int, flavour: str):
        self.grad_clip, self.world, self.flavour = grad_clip, world, flavour


def test_strategy_from_its_target_and_lightnings_own_names_pass_through():
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

    from src.jobs.checks import validate_job
    from src.jobs.strategies import build_strategy

    def built(*overrides):
        cfg = compose_job(["experiment=grpo", "trainer.devices=2", *overrides])
        validate_job(cfg)
        return build_strategy(cfg.trainer, 0.5, 2)

    ddp = built("trainer.strategy=ddp")
    assert isinstance(ddp, DDPStrategy) and ddp._ddp_kwargs["find_unused_parameters"] is True
    fsdp = built("trainer.strategy=fsdp")
    assert isinstance(fsdp, ModelParallelStrategy) and fsdp._data_parallel_size == 2
    assert built("trainer.strategy=auto") == "auto" and built("trainer.strategy=ddp_spawn") == "ddp_spawn"
    mine = built(
        f"+trainer.strategies.mine._target_={__name__}._MyStrategy",
        "+trainer.strategies.mine.flavour=plain",
        "trainer.strategy=mine",
    )
    assert isinstance(mine, _MyStrategy) and (mine.grad_clip, mine.world, mine.flavour) == (0.5, 2, "plain")


def test_the_module_takes_the_router_config_as_its_lambda_settings():
    """One source: the λ keys of ``router`` are DualSettings' fields, read by the module as they are."""
    from dataclasses import fields

    from src.config.schema import DualSettings, RouterConfig
    from src.jobs.build import dataclass_from

    cfg = compose_job(["experiment=router_grpo", "router.lambda_lr=0.25", "router.lambda_update=pid"])
    router = dataclass_from(RouterConfig, cfg.router)
    assert isinstance(router, DualSettings)
    assert (router.lambda_lr, router.lambda_update) == (0.25, "pid")
    assert {f.name for f in fields(DualSettings)} <= set(cfg.router)  # every field is a config key


def constant_advantage_loss_module(algorithm, value: float):
    """A researcher's loss module: the default one, except that every advantage is ``value``."""
    from dataclasses import replace

    from src.algorithms.loss_module import build_loss_module

    return replace(
        build_loss_module(algorithm),
        advantage_name="constant",
        advantage_fn=lambda rewards, index: torch.full_like(rewards, value),
    )


def test_every_algorithm_and_experiment_defaults_to_the_registry_loss_module():
    from pathlib import Path

    configs = Path(__file__).resolve().parents[3] / "configs"
    overrides = [f"algorithm={p.stem}" for p in sorted((configs / "algorithm").glob("*.yaml"))]
    overrides += [f"experiment={p.stem}" for p in sorted((configs / "experiment").glob("*.yaml"))]
    for override in overrides:
        node = compose_job([override]).algorithm.loss_module
        assert dict(node) == {"_target_": "src.algorithms.loss_module.build_loss_module"}, override


def test_the_default_target_builds_the_registry_loss_module():
    """Same names, same functions bound to the same params: what ``build_loss_module`` gives."""
    from src.algorithms.loss_module import build_loss_module
    from src.config.schema import AlgorithmGroupConfig
    from src.jobs.build import build_loss, dataclass_from

    cfg = compose_job(["algorithm=ppo"])
    algorithm = dataclass_from(AlgorithmGroupConfig, cfg.algorithm)
    built, direct = build_loss(cfg, algorithm), build_loss_module(algorithm)
    assert type(built) is type(direct)
    for name in ("advantage_fn", "policy_loss_fn"):
        a, b = getattr(built, name), getattr(direct, name)
        assert (a.func, a.args, a.keywords.keys()) == (b.func, b.args, b.keywords.keys())
    assert (built.advantage_name, built.policy_loss_name, built.agg_mode, built.norm_len) == (
        direct.advantage_name,
        direct.policy_loss_name,
        direct.agg_mode,
        direct.norm_len,
    )
    # a run manifest written before the node existed: the schema's default
    old = OmegaConf.create({"algorithm": {k: v for k, v in cfg.algorithm.items() if k != "loss_module"}})
    assert build_loss(old, algorithm).advantage_name == direct.advantage_name


def test_the_module_trains_with_the_loss_module_of_its_target(tiny_model_dir):
    from src.jobs.build import build_module
    from src.jobs.checks import validate_job
    from src.rollout.batch import RolloutBatch

    cfg = compose_job(
        [
            "experiment=grpo",
            f"algorithm.loss_module._target_={__name__}.constant_advantage_loss_module",
            "+algorithm.loss_module.value=0.25",
            "algorithm.use_kl_loss=false",  # no reference model to load here
        ]
    )
    validate_job(cfg)
    module = build_module(cfg, tiny_model_dir)
    assert module.loss_module.advantage_name == "constant"
    n, width = 4, 3
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]]).float()
    rb = RolloutBatch(
        input_ids=torch.ones(n, 2 + width, dtype=torch.long),
        attention_mask=torch.ones(n, 2 + width, dtype=torch.long),
        response_mask=mask,
        rewards=torch.tensor([1.0, 0.0, 0.5, 2.0]),
        uids=[0, 0, 1, 1],
        rollout_log_probs=torch.zeros(n, width),
    )
    torch.testing.assert_close(module._loss_inputs(rb, n_minibatches=1).advantages, 0.25 * mask)


def test_a_bad_loss_module_target_names_its_key():
    """As for the collector: Hydra's error when the module is built names the target and the node."""
    from hydra.errors import InstantiationException

    from src.config.schema import AlgorithmGroupConfig
    from src.jobs.build import build_loss, dataclass_from

    cfg = compose_job(["algorithm.loss_module._target_=src.algorithms.loss_module.no_such_factory"])
    with pytest.raises(InstantiationException) as err:
        build_loss(cfg, dataclass_from(AlgorithmGroupConfig, cfg.algorithm))
    assert "no_such_factory" in str(err.value) and "full_key: algorithm.loss_module" in str(err.value)


class _NeedsManifest:
    """A researcher's callback that takes one of the job's runtime inputs by name."""

    def __init__(self, manifest, tag: str = "x"):
        self.manifest, self.tag = manifest, tag


def test_callbacks_from_their_target_in_the_configs_order(tmp_path):
    from src.callbacks.checkpointing import ManifestCheckpoint, StopOnSignal
    from src.callbacks.held_out_routing import HeldOutRoutingLogger
    from src.callbacks.progress import StepProgressBar
    from src.callbacks.route_confusion import RouteConfusionLogger
    from src.callbacks.step_only import StepOnlyScalars
    from src.jobs.build import build_callbacks

    run = tmp_path / "run"
    asked: list[str] = []

    def runtime(**values):
        return {k: (lambda k=k, v=v: asked.append(k) or v) for k, v in values.items()}

    given = runtime(manifest="M", families="F", pad_id=0, replay=None, cfg="C")
    cfg = compose_job(
        ["experiment=router_grpo", f"run_dir={run}", "trainer.val_check_interval=7", "trainer.save_freq=3"]
    )
    built = build_callbacks(cfg, given)
    assert [type(cb).__name__ for cb in built] == [
        "StepProgressBar", "StepOnlyScalars", "RolloutLogger", "RouteConfusionLogger",
        "HeldOutRoutingLogger", "StepScalarCarry", "ValidationAfterCheckpoint", "LaunchRecord",
        "ManifestCheckpoint", "StopOnSignal",
    ]  # fmt: skip
    bar, confusion, held_out, ckpt, stop = built[0], built[3], built[4], built[8], built[9]
    assert isinstance(bar, StepProgressBar) and bar.budget == cfg.router.budget
    assert isinstance(built[1], StepOnlyScalars)
    assert isinstance(confusion, RouteConfusionLogger) and confusion.every == 7
    assert isinstance(held_out, HeldOutRoutingLogger) and (held_out.families, held_out.pad_id) == ("F", 0)
    assert held_out.out_dir == run / "rollouts" / "val"
    assert isinstance(ckpt, ManifestCheckpoint) and ckpt._every_n_train_steps == 3
    assert isinstance(stop, StopOnSignal)
    assert ckpt.manifest == "M" and stop.manifest == "M" and built[7].cfg == "C"

    # without a router its two callbacks are left out; null leaves one out; your own comes last
    # and gets the runtime input it takes by name, its own settings from its node
    asked.clear()
    cfg = compose_job(
        ["experiment=grpo", f"run_dir={run}", "callbacks.progress_bar=null",
         f"+callbacks.mine._target_={__name__}._NeedsManifest", "+callbacks.mine.tag=y"]
    )  # fmt: skip
    built = build_callbacks(cfg, runtime(manifest="M", families="F", pad_id=0, replay=None, cfg="C"))
    names = [type(cb).__name__ for cb in built]
    assert "RouteConfusionLogger" not in names and "HeldOutRoutingLogger" not in names
    assert "StepProgressBar" not in names and names[-1] == "_NeedsManifest"
    assert (built[-1].manifest, built[-1].tag) == ("M", "y")
    assert "families" not in asked  # a runtime input nobody takes is never made

    # the SFT fit's, the same way: its signal stop saves where the fit says
    cfg = compose_job(["experiment=sft", f"run_dir={run}", "sft.log_every=5"])
    bar, progress, stop = build_callbacks(cfg, runtime(save_to=run / "sft.ckpt"), group="sft_callbacks")
    assert isinstance(bar, StepProgressBar) and progress.every == 5
    assert isinstance(stop, StopOnSignal) and stop.save_to == run / "sft.ckpt"


def test_a_callback_without_a_target_is_a_config_error():
    from src.config.validate import ConfigError, validate

    cfg = compose_job(["experiment=grpo", "+callbacks.mine.tag=y"])
    with pytest.raises(ConfigError, match=r"callbacks\.mine: no _target_"):
        validate(cfg)
