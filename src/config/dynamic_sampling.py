"""``algorithm.dynamic_sampling``: DAPO's dead-group filter and refill (``src.rollout.dynamic_refill``).

A GRPO group whose rollouts all earn the same reward carries no advantage. With ``enable`` the
step drops such groups and refills the batch from further seeded draws of training prompts, at
most ``max_extra_batches`` extra collect calls of ``n_prompts`` prompts each (the bound on extra
generation); the batch keeps ``n_prompts`` groups, padded with dead ones when the bound is hit.

Off by default. Measured on experiment=router_grpo (issue 19): the kept groups' router gradient
is no longer diluted by the dead ones, so an early push to one route is several times larger; on
seeds 0 and 3 the router collapsed to "answer" by step 10 (entropy 0, every later group dead,
λ -> 0), and on seed 4 neither the last-50-step cost nor the held-out accuracies improved.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from src.config.checks import one_of, positive

ON_CHOICES = ("actor", "router", "either")
SHARDED = ("fsdp", "deepspeed_stage_3")


@dataclass
class DynamicSamplingConfig:
    enable: bool = False
    # which reward must vary for a group to be kept: the actor's, the router's r_router, or either
    on: str = "either"
    max_extra_batches: int = 2  # extra collect calls per step, each of n_prompts fresh prompts
    eps: float = 1e-6  # a group is dead when max - min of its rewards <= eps


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
    world = int(cfg.trainer.devices) * int(cfg.trainer.num_nodes)
    if world > 1 and cfg.trainer.strategy in SHARDED:
        # each rank refills on its own: a generate that gathers sharded weights would wait on ranks
        # that collect fewer refills
        problems.append(
            f"{key}.enable: not with a sharded trainer.strategy ({cfg.trainer.strategy}) on {world} ranks"
        )
    return problems
