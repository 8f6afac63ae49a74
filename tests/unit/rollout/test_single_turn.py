"""SingleTurnCollector with the real tiny model: routing, routed prompts, scoring, the typed batch."""

from __future__ import annotations

import pytest
import torch

from src.config.sampling import SamplingParams
from src.config.schema import RouterConfig
from src.datamodules.rlla_datamodule import prompt_token_ids
from src.datamodules.synthetic import TOOLS, build_system_prompt, build_user_turn
from src.rewards.dispatch import score
from src.rewards.rlla import RewardConfig
from src.rollout.batch import CollectRequest
from src.rollout.engines.hf import HFGenerateEngine
from src.rollout.single_turn import ResponseScorer, SingleTurnCollector
from src.router.families import ToolFamilies
from src.router.head import RouterHead
from src.router.routes import record_context, routed_messages
from src.router.usage import tool_usage

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CALC_TRUTH = (
    '<think> compute </think>\n<tool_call>\n{"name": "calculator", "parameters": {"expression": "3*7"}}\n'
    "</tool_call>"
)


def make_records(tok) -> list[dict]:
    system = build_system_prompt([TOOLS["calculator"], TOOLS["web_search"]])
    out = []
    for uid, question in enumerate(["Compute 3*7.", "What is the capital of Norway?"]):
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": build_user_turn(question)},
        ]
        out.append(
            {
                "uid": uid,
                "data_source": "rlla",
                "messages": messages,
                "ground_truth": CALC_TRUTH if uid == 0 else "<think> x </think>\n<response> Oslo </response>",
                "prompt_ids": prompt_token_ids(tok, messages),
            }
        )
    return out


def fixed_logits(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Prompt 0 -> calculate, prompt 1 -> answer (argmax)."""
    logits = torch.zeros(ids.shape[0], 3)
    logits[0, 2] = logits[1, 0] = 5.0
    return logits


def collector(tiny, router: bool, temperature: float = 0.7) -> SingleTurnCollector:
    model, tok = tiny
    return SingleTurnCollector(
        tok,
        HFGenerateEngine(model, tok.pad_token_id, [tok.eos_token_id]),
        SamplingParams(n_generations_per_prompt=2, temperature=temperature, max_new_tokens=6),
        ResponseScorer(ToolFamilies(), lambda usage: 0.5 * usage.n_calls, RewardConfig()),
        RouterConfig(enable=router, sample=False, actor_reward="router"),
        router_logits_fn=fixed_logits if router else None,
    )


def test_routed_collect_returns_a_typed_batch(tiny):
    _, tok = tiny
    records = make_records(tok)
    torch.manual_seed(0)
    batch = collector(tiny, router=True).collect(CollectRequest(records, step=3, lam=2.0))
    assert len(batch) == 4 and batch.uids == [0, 0, 1, 1]
    torch.testing.assert_close(batch.temperatures, torch.full((4,), 0.7))
    assert batch.router.action.tolist() == [2, 2, 0, 0]
    assert batch.router.target.tolist() == [2, 2, 0, 0]  # weak labels: CALCULATE, ANSWER
    families = ToolFamilies()
    for i, row in enumerate(batch.rows):
        rec = records[i // 2]
        assert row["route"] == ("calculate" if i < 2 else "answer") and row["step"] == 3
        # the prompt the actor saw is the routed one
        ctx = record_context(rec, families, with_label=True)
        routed = prompt_token_ids(
            tok, routed_messages(ctx, batch.router.action[i].item(), families, "emphasis")
        )
        assert batch.input_ids[i][batch.attention_mask[i].bool()].tolist()[: len(routed)] == routed
        # reward, usage and cost by the reward / usage modules on the decoded text
        parts = score("rlla", row["response"], rec["ground_truth"], step=3)
        usage = tool_usage(row["response"], families, fmt="xml", descriptions=ctx.descriptions)
        assert row["reward_task"] == pytest.approx(parts.total)
        assert row["cost"] == pytest.approx(0.5 * usage.n_calls)
        assert row["reward_router"] == pytest.approx(parts.total - 2.0 * row["cost"])
        # the router part keeps the r_task and λ its r_router was formed from (router.advantage)
        assert batch.router.task_reward[i] == pytest.approx(parts.total) and batch.router.lam[i] == 2.0
        assert batch.rewards[i] == pytest.approx(row["reward_router"])  # actor_reward: router
    assert {"timing/generation_s", "timing/scoring_s", "rollout/generated_tokens"} <= set(batch.metrics)


def test_unrouted_collect_with_greedy_eval_sampling(tiny):
    """Evaluation passes its own sampling (greedy, one sample): temperature 0 on every row."""
    _, tok = tiny
    records = make_records(tok)
    greedy = SamplingParams(n_generations_per_prompt=1, temperature=0.0, max_new_tokens=6)
    batch = collector(tiny, router=False).collect(CollectRequest(records, step=0, sampling=greedy))
    assert batch.router is None and "route" not in batch.rows[0] and batch.uids == [0, 1]
    torch.testing.assert_close(batch.temperatures, torch.zeros(2))
    width = batch.prompt_width
    for i in range(2):
        ids = batch.input_ids[i, :width][batch.attention_mask[i, :width].bool()].tolist()
        assert ids == records[i]["prompt_ids"]
    torch.testing.assert_close(batch.rewards, torch.tensor([r["reward_task"] for r in batch.rows]))


def test_validation_takes_the_routers_argmax_routes(tiny):
    """A sampling router draws routes in training; ``argmax_routes`` (validation) takes its choice."""
    _, tok = tiny
    records = make_records(tok)
    col = collector(tiny, router=True)
    col.router.sample = True
    col.router_logits_fn = lambda ids, mask: torch.tensor([[0.0, 0.5, 0.8], [0.6, 0.0, 0.3]])
    drawn, chosen = set(), set()
    for seed in range(8):
        request = CollectRequest(records, step=0, generator=torch.Generator().manual_seed(seed))
        drawn.add(tuple(col.route(records, 2, request.generator, True).action.tolist()))
        argmax = CollectRequest(
            records,
            step=0,
            sampling=SamplingParams(n_generations_per_prompt=1, temperature=0.0, max_new_tokens=4),
            generator=torch.Generator().manual_seed(seed),
            argmax_routes=True,
        )
        chosen.add(tuple(col.collect(argmax).router.action.tolist()))
    assert len(drawn) > 1 and chosen == {(2, 0)}


def test_keyed_route_draw_is_the_inverse_cdf_at_each_rows_uniform():
    g = torch.Generator().manual_seed(0)
    logits, u = torch.randn(64, 3, generator=g) * 2, torch.rand(64, generator=g)
    got = RouterHead.act(logits, sample=True, uniforms=u).router_action.tolist()
    for b in range(64):
        cumulative, pick = 0.0, 2
        for action, p in enumerate(torch.softmax(logits[b].double(), -1).tolist()):
            cumulative += p
            if u[b].item() < cumulative:
                pick = action
                break
        assert got[b] == pick, b


def test_keyed_draws_give_a_prompt_its_routes_and_tokens_in_any_batch(tiny):
    """``draw_seed``: each row's route and tokens come from streams keyed by (seed, uid, copy), so a
    prompt collected alone (another rank's shard) gets the rows it gets beside others, whatever
    torch's default generator holds; another seed draws others."""
    _, tok = tiny
    records = make_records(tok)
    col = collector(tiny, router=True, temperature=1.0)
    col.router.sample = True
    col.router_logits_fn = lambda ids, mask: torch.zeros(ids.shape[0], 3)  # every route equally likely
    fields = ("uid", "route", "response", "reward_task", "cost")

    def rows(batch):
        return [tuple(r[f] for f in fields) for r in batch.rows]

    torch.manual_seed(1)
    both = col.collect(CollectRequest(records, step=0, draw_seed=11))
    torch.manual_seed(2)
    alone = col.collect(CollectRequest(records[1:], step=0, draw_seed=11))
    assert rows(alone) == rows(both)[2:]
    assert batch_routes(alone) == batch_routes(both)[2:]
    other = col.collect(CollectRequest(records, step=0, draw_seed=12))
    assert rows(other) != rows(both)


def batch_routes(batch) -> list[int]:
    return batch.router.action.tolist()
