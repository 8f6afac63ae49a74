"""The Lightning strategy that ``trainer.strategy`` names: ddp, fsdp (FSDP2), deepspeed_stage_2/3.

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

__all__ = ["MULTI_PROCESS", "SHARDED", "single_optimizer", "strategy_from"]

SHARDED = ("fsdp", "deepspeed_stage_2", "deepspeed_stage_3")
MULTI_PROCESS = ("ddp", *SHARDED)


def single_optimizer(name: str) -> bool:
    """Multi-process strategies train one optimizer (DeepSpeed accepts no other; the others match
    it so the four agree): the router head becomes a parameter group with its own learning rate."""
    return str(name) in MULTI_PROCESS


def strategy_from(name: str, grad_clip: float = 0.0, world: int = 1):
    """A Strategy instance for the names above (``world`` processes in all); any other name goes
    to Lightning as it is."""
    name = str(name)
    if name == "ddp":
        from lightning.pytorch.strategies import DDPStrategy

        # the router head is unused by the actor's backward (and vice versa)
        return DDPStrategy(find_unused_parameters=True)
    if name == "fsdp":
        from lightning.pytorch.strategies import ModelParallelStrategy

        # every process is a data-parallel replica holding a shard (no tensor parallelism)
        return ModelParallelStrategy(data_parallel_size=world, tensor_parallel_size=1)
    if name in ("deepspeed_stage_2", "deepspeed_stage_3"):
        return _deepspeed(int(name[-1]), grad_clip)
    return name


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
