"""The Lightning strategy that ``trainer.strategy`` names: ddp, fsdp (FSDP2), deepspeed_stage_2/3.

``trainer.strategies`` (configs/train.yaml) maps each name to a node built with Hydra
``instantiate`` from its ``_target_`` (the builders below, plus ``grad_clip`` and ``world``); a
researcher's own strategy is one more node (``+trainer.strategies.mine._target_=my.module.build
trainer.strategy=mine``), no code here changes. A name that is not a key there (``auto``,
``ddp_spawn``, ...) goes to Lightning as it is.

Each works with ``trainer.devices=N`` on CPU (gloo) and on GPUs (nccl): the process-group backend
is left to Lightning, which picks it from the device. What Lightning refuses on CPU is overridden
here and nothing else:

- ``fsdp`` is FSDP2 (``fully_shard``, applied by ``ToolRouterModule.configure_model`` per decoder
  layer, actor and router head) through Lightning's ``ModelParallelStrategy`` with the whole world
  as the data-parallel mesh dimension. FSDP1 cannot run this job: rollouts call the actor outside
  FSDP's forward and the manual backward runs inside its forward state.
- DeepSpeed's CPU accelerator works (gloo), but Lightning checks for CUDA in three places.

All of them keep the project's seeded, rank-sharded sampler (``use_distributed_sampler=False``
in the Trainer): every world size sees the same global prompt order.
"""

from __future__ import annotations

import argparse

from hydra.utils import instantiate
from omegaconf import DictConfig

__all__ = [
    "MULTI_PROCESS",
    "SHARDED",
    "build_strategy",
    "ddp",
    "deepspeed",
    "fsdp",
    "strategy_names",
]

SHARDED = ("fsdp", "deepspeed_stage_2", "deepspeed_stage_3")
MULTI_PROCESS = ("ddp", *SHARDED)


def strategy_names(cfg: DictConfig) -> list[str]:
    """What ``trainer.strategy`` may name: a ``trainer.strategies`` key or one of Lightning's own."""
    from lightning.pytorch.strategies import StrategyRegistry

    return list(dict.fromkeys(["auto", *cfg.trainer.strategies, *StrategyRegistry.available_strategies()]))


def build_strategy(trainer: DictConfig, grad_clip: float, world: int):
    """``trainer.strategies[trainer.strategy]`` instantiated (``world`` processes in all); any
    other name goes to Lightning as it is."""
    name = str(trainer.strategy)
    if name not in trainer.strategies:
        return name
    return instantiate(trainer.strategies[name], grad_clip=float(grad_clip), world=int(world))


# ---------------------------------------------------------------------------- builders (``_target_``)
def ddp(*, grad_clip: float, world: int):
    from lightning.pytorch.strategies import DDPStrategy

    del grad_clip, world  # Lightning clips; the launcher sets the world
    # the router head is unused by the actor's backward (and vice versa)
    return DDPStrategy(find_unused_parameters=True)


def fsdp(*, grad_clip: float, world: int):
    from lightning.pytorch.strategies import ModelParallelStrategy

    del grad_clip  # Lightning clips
    # every process is a data-parallel replica holding a shard (no tensor parallelism)
    return ModelParallelStrategy(data_parallel_size=world, tensor_parallel_size=1)


def deepspeed(*, stage: int, grad_clip: float, world: int):
    del world
    return _deepspeed(int(stage), grad_clip)


def _deepspeed(stage: int, grad_clip: float):
    from lightning.pytorch.strategies import DeepSpeedStrategy

    class DeviceAgnosticDeepSpeed(DeepSpeedStrategy):
        """Lightning's DeepSpeedStrategy without its CUDA-only checks (DeepSpeed itself picks the
        CPU accelerator and gloo where there is no GPU)."""

        def setup_environment(self) -> None:
            if self.root_device.type == "cuda":
                return super().setup_environment()
            # skip DeepSpeedStrategy's CUDA check, keep the DDP environment set-up
            return super(DeepSpeedStrategy, self).setup_environment()

        def setup_distributed(self) -> None:
            if self.root_device.type == "cuda":
                return super().setup_distributed()
            # CPU devices have no index to validate
            self.set_world_ranks()
            self._init_deepspeed_distributed()

        def _setup_model_and_optimizer(self, model, optimizer, lr_scheduler=None):
            import deepspeed

            # DeepSpeed reads the device from device_rank: the local rank where devices have no index
            index = self.root_device.index
            engine, opt, _, _ = deepspeed.initialize(
                args=argparse.Namespace(device_rank=self.local_rank if index is None else index),
                config=self.config,
                model=model,
                model_parameters=filter(lambda p: p.requires_grad, model.parameters()),
                optimizer=optimizer,
                lr_scheduler=lr_scheduler,
                dist_init_required=False,
            )
            return engine, opt

    strategy = DeviceAgnosticDeepSpeed(stage=stage)
    # DeepSpeed clips inside its step (Lightning's clip_gradients is a no-op under it): the same
    # global-norm clip as the other strategies, from algorithm.grad_clip
    if grad_clip and grad_clip > 0:
        strategy.config["gradient_clipping"] = float(grad_clip)
    return strategy
