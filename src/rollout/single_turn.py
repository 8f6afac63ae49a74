"""Single-turn rollouts: route (optional), generate G responses per prompt, score, cost.

Orchestration only: rewards, tool usage, costs and prompts come from their own modules.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from src.rewards.dispatch import response_format, score
from src.rewards.types import RewardConfig
from src.rollout.batch import RolloutBatch, RouterRollout, assemble_sequences
from src.rollout.engine import RolloutEngine, SamplingParams, left_pad
from src.rollout.routes import Route, weak_label_index

log = logging.getLogger(__name__)

ROUTE_NAMES = tuple(r.label for r in Route)


@dataclass
class RouterSettings:
    enable: bool = False
    sample: bool = True  # False: argmax
    prompt_mode: str = "emphasis"  # or "only_family"
    actor_reward: str = "task"  # the actor's GRPO reward: "task" (r_task) or "router" (r_task − λ·cost)


def decode_response(tokenizer, token_ids: list[int], drop_ids: set[int]) -> str:
    """Assistant text of a completion: stop/pad tokens removed, other special tokens kept (harmony)."""
    return tokenizer.decode([t for t in token_ids if t not in drop_ids], skip_special_tokens=False)


class SingleTurnCollector:
    """Builds one :class:`RolloutBatch` from P prompt records (see ``RLLADataModule``)."""

    def __init__(
        self,
        tokenizer,
        engine: RolloutEngine,
        sampling: SamplingParams,
        reward_config: RewardConfig,
        router: RouterSettings,
        families=None,
        cost_fn: Callable | None = None,
        router_logits_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ):
        self.tokenizer = tokenizer
        self.engine = engine
        self.sampling = sampling
        self.reward_config = reward_config
        self.router = router
        if families is None:
            from src.rewards.tool_families import ToolFamilies

            families = ToolFamilies()
        self.families = families
        self.cost_fn = cost_fn
        self.router_logits_fn = router_logits_fn
        self.drop_ids = {tokenizer.pad_token_id, tokenizer.eos_token_id, *sampling.stop_token_ids}

    def _encode(self, messages: list[dict]) -> list[int]:
        from src.datamodules.rlla_datamodule import prompt_token_ids

        return prompt_token_ids(self.tokenizer, messages)

    @torch.no_grad()
    def collect(
        self,
        records: list[dict[str, Any]],
        step: int,
        lam: float = 0.0,
        generator: torch.Generator | None = None,
        sampling: SamplingParams | None = None,
    ) -> RolloutBatch:
        """``sampling`` overrides the training sampling (evaluation uses greedy, one sample)."""
        from dataclasses import replace

        from src.rewards.tool_families import tool_descriptions, weak_label
        from src.rewards.tool_usage import tool_usage

        sampling = sampling or self.sampling

        g = sampling.n
        n_prompts = len(records)
        t0 = time.perf_counter()
        pad = self.tokenizer.pad_token_id
        router_out = None
        if self.router.enable:
            p_ids, p_mask = left_pad([r["prompt_ids"] for r in records], pad)
            logits = self.router_logits_fn(p_ids, p_mask).float().cpu()  # [P, 3]
            from src.models.router_head import RouterHead

            router_out = RouterHead.act(
                logits.repeat_interleave(g, dim=0), sample=self.router.sample, generator=generator
            )
            prompts = [
                self._encode(self._route_messages(records[i // g], int(router_out.router_action[i])))
                for i in range(n_prompts * g)
            ]
            completions = self.engine.generate(prompts, replace(sampling, n=1))
        else:
            prompts = [r["prompt_ids"] for r in records for _ in range(g)]
            completions = self.engine.generate([r["prompt_ids"] for r in records], sampling)
        t_gen = time.perf_counter() - t0

        t1 = time.perf_counter()
        per_prompt = []  # (format, tool descriptions, weak label) of each prompt, shared by its G copies
        for rec in records:
            fmt = response_format(rec["data_source"])
            descriptions = tool_descriptions(rec["messages"][0]["content"])
            label = rec.get("weak_label") or weak_label(
                rec["ground_truth"], self.families, fmt=fmt, descriptions=descriptions
            )
            per_prompt.append((fmt, descriptions, label))
        rows, r_task, costs, targets = [], [], [], []
        for i, tokens in enumerate(completions.token_lists()):
            rec = records[i // g]
            fmt, descriptions, label = per_prompt[i // g]
            text = decode_response(self.tokenizer, tokens, self.drop_ids)
            parts = score(rec["data_source"], text, rec["ground_truth"], step=step, config=self.reward_config)
            row = {
                "step": step,
                "uid": rec["uid"],
                "data_source": rec["data_source"],
                "response": text,
                "response_length": len(tokens),
                "reward_task": parts.total,
                "reward_format": parts.format,
                "reward_correctness": parts.correctness,
                "reward_length": parts.length,
            }
            usage = tool_usage(text, self.families, fmt=fmt, descriptions=descriptions)
            cost = float(self.cost_fn(usage)) if self.cost_fn else float(usage.used_any_tool)
            row.update(
                used_tool=usage.used_any_tool,
                used_search=usage.used_search,
                used_calculate=usage.used_calculate,
                n_tool_calls=usage.n_calls,
                cost=cost,
            )
            costs.append(cost)
            if router_out is not None:
                a = int(router_out.router_action[i])
                row.update(
                    route=ROUTE_NAMES[a],
                    router_prob=float(router_out.router_log_prob[i].exp()),
                    weak_label=label,
                )
                targets.append(weak_label_index(label))
            r_task.append(parts.total)
            rows.append(row)
        t_score = time.perf_counter() - t1

        rewards_task = torch.tensor(r_task, dtype=torch.float32)
        router = None
        if router_out is not None:
            cost_t = torch.tensor(costs, dtype=torch.float32)
            r_router = rewards_task - lam * cost_t
            for row, rr in zip(rows, r_router.tolist()):
                row["reward_router"] = rr
            router = RouterRollout(
                prompt_ids=p_ids,
                prompt_mask=p_mask,
                prompt_index=torch.arange(n_prompts).repeat_interleave(g),
                action=router_out.router_action,
                log_prob=router_out.router_log_prob,
                reward=r_router,
                cost=cost_t,
                target=torch.tensor(targets, dtype=torch.long),
            )
        actor_rewards = (
            router.reward if router is not None and self.router.actor_reward == "router" else rewards_task
        )
        input_ids, attention_mask = assemble_sequences(
            prompts, completions.response_ids, completions.response_mask, pad
        )
        n_tokens = int(completions.response_mask.sum())
        metrics = {
            "timing/generation_s": t_gen,
            "timing/scoring_s": t_score,
            "rollout/generated_tokens": float(n_tokens),
        }
        return RolloutBatch(
            input_ids=input_ids,
            attention_mask=attention_mask,
            response_mask=completions.response_mask,
            rewards=actor_rewards,
            uids=[r["uid"] for r in records for _ in range(g)],
            rollout_log_probs=completions.log_probs,
            router=router,
            rows=rows,
            metrics=metrics,
        )

    def _route_messages(self, record: dict, action: int) -> list[dict]:
        from src.rollout.route_prompts import route_messages

        return route_messages(
            record["messages"],
            Route(action),
            self.families,
            mode=self.router.prompt_mode,
            fmt=response_format(record["data_source"]),
        )
